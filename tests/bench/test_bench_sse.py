from fdcli.bench.sse import SSEDecoder, iter_events


def test_data_lines_blank_line_dispatch_and_done():
    lines = ['data: {"a": 1}', "", "data: [DONE]", ""]
    assert [e.data for e in iter_events(lines)] == ['{"a": 1}', "[DONE]"]


def test_multiline_data_joined_with_newline_and_comments_ignored():
    lines = [": keep-alive", "event: delta", "data: first", "data:second", "id: 7", "retry: 10", ""]
    (event,) = iter_events(lines)
    assert event.data == "first\nsecond"
    assert event.event == "delta"


def test_only_one_space_after_colon_is_stripped_and_crlf_tolerated():
    (event,) = iter_events(["data:  two spaces\r\n", "\r\n"])
    assert event.data == " two spaces"


def test_missing_final_blank_line_is_flushed_by_finish():
    decoder = SSEDecoder()
    assert decoder.feed_line("data: tail") is None
    assert decoder.finish().data == "tail"
    assert decoder.finish() is None


def test_blank_lines_without_data_dispatch_nothing():
    assert iter_events(["", "", ": comment", "", "event: x", ""]) == []
