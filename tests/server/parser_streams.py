"""Parser test helpers: an output split whole, and streamed in pieces with the deltas reassembled as
a client does (the chat layer's OutputSplitter both ways)."""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.serving_tools import OutputSplitter


def whole(parser_cls, text, reasoning_cls=None):
    out = OutputSplitter(reasoning_cls, parser_cls).split(text)
    return out.reasoning, out.content, [(c.function.name, c.function.arguments) for c in out.tool_calls]


def streamed(parser_cls, pieces, reasoning_cls=None):
    """The stream's deltas reassembled as a client does: calls by index, arguments concatenated."""
    splitter = OutputSplitter(reasoning_cls, parser_cls)
    reasoning, content, calls = "", "", {}
    for i, piece in enumerate(pieces):
        out = splitter.feed(piece, final=i == len(pieces) - 1)
        reasoning, content = reasoning + out.reasoning, content + out.content
        for d in out.call_deltas:
            fn = d.function if isinstance(d.function, dict) else d.function.model_dump()
            name, args = calls.get(d.index, (None, ""))
            calls[d.index] = (fn.get("name") or name, args + (fn.get("arguments") or ""))
    return reasoning, content, [calls[k] for k in sorted(calls)]


def cuts(text, step=1):
    """Every cut of `text` in two (each `step`-th), and one piece per character."""
    for i in range(0, len(text) + 1, step):
        yield [text[:i], text[i:]]
    yield list(text)


def check_whole_and_streamed(parser_cls, text, content, calls, step=3):
    """`text` parses to (content, calls) whole, and streamed at every `step`-th cut and per character
    (a stream's empty content is None)."""
    assert whole(parser_cls, text)[1:] == (content, calls)
    for pieces in cuts(text, step):
        _, c, sent = streamed(parser_cls, pieces)
        assert (c or None, sent) == (content, calls), pieces
