"""request_limits.check_request: every length and vocabulary rule, each error naming its field."""

from __future__ import annotations

import pytest

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.request_limits import check_request, max_output_tokens


def test_returns_the_tokens_the_request_may_generate():
    assert check_request([1, 2, 3], None, max_model_len=10) == 7
    assert check_request([1, 2, 3], 4, max_model_len=10) == 4
    assert check_request([1, 2, 3], 7, max_model_len=10) == 7
    assert check_request([1, 2, 3], 99, max_model_len=10, pooling=True) is None  # pooling ignores it
    assert max_output_tokens(3, 99, 10) == 7


@pytest.mark.parametrize(
    ("ids", "kw", "param", "needle"),
    [
        ([], {}, "prompt", "the prompt is empty"),
        ([], {"pooling": True, "prompt_param": "input"}, "input", "input is empty"),
        ([1, 50], {"vocab_size": 50}, "prompt", "outside the vocabulary (size 50)"),
        ([-1], {"vocab_size": 50}, "prompt", "out of range"),
        ([1] * 10, {}, "prompt", "maximum context length is 10"),
        ([1] * 3, {"max_tokens": 8}, "max_tokens", "at most 7 tokens can be generated"),
        (
            [1] * 3,
            {"max_tokens": 8, "max_tokens_param": "max_completion_tokens"},
            "max_completion_tokens",
            "11",
        ),
        ([1] * 11, {"pooling": True, "prompt_param": "input"}, "input", "takes at most 10"),
    ],
)
def test_each_rule_names_its_field(ids, kw, param, needle):
    max_tokens = kw.pop("max_tokens", None)
    with pytest.raises(InvalidRequestError) as info:
        check_request(ids, max_tokens, max_model_len=10, **kw)
    assert info.value.param == param and needle in str(info.value), str(info.value)


def test_an_unknown_vocabulary_is_not_checked():
    assert check_request([10**6], None, max_model_len=10, vocab_size=0) == 9


def test_default_max_tokens_fills_an_absent_one_within_the_room():
    # vLLM's get_max_tokens: the request's own value, else the default, capped by the context's room.
    assert check_request([1, 2, 3], None, max_model_len=100, default_max_tokens=5) == 5
    assert check_request([1, 2, 3], 40, max_model_len=100, default_max_tokens=5) == 40  # explicit wins
    assert check_request([1, 2, 3], None, max_model_len=10, default_max_tokens=50) == 7  # no error
    assert check_request([1], 9, max_model_len=10, default_max_tokens=2, pooling=True) is None
