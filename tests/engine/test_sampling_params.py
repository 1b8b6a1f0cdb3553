"""SamplingParams as vLLM users build it: the ValueError of a bad value, from_optional, best_of."""

from __future__ import annotations

import pytest

from fdcli_engine.errors import FdError, InvalidRequestError
from fdcli_engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("field", "value"), [("temperature", -1), ("top_p", 1.5), ("n", 0), ("max_tokens", 0)]
)
def test_a_bad_value_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field) as info:  # vLLM raises ValueError; fd's error is one
        SamplingParams(**{field: value})
    assert isinstance(info.value, InvalidRequestError) and isinstance(info.value, FdError)
    assert info.value.param == field


def test_from_optional_takes_the_default_for_none():
    p = SamplingParams.from_optional(n=None, temperature=None, top_p=0.5, seed=None, logprobs=None)
    assert (p.n, p.temperature, p.top_p, p.seed, p.logprobs) == (1, 1.0, 0.5, None, None)
    assert p.max_tokens == 16  # not given: the default
    assert SamplingParams.from_optional(max_tokens=None).max_tokens is None  # None: up to the context
    assert SamplingParams.from_optional(stop=None, stop_token_ids=None).stop == []
    with pytest.raises(TypeError, match="temprature"):
        SamplingParams.from_optional(temprature=0.5)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams.from_optional(temperature=-1)


def test_best_of_equal_to_n_is_accepted_and_otherwise_refused_naming_n():
    assert SamplingParams(n=2, best_of=2, seed=1).for_sample(1).n == 1  # the samples are plain n=1
    with pytest.raises(ValueError, match="best_of must equal n; use n=3") as info:
        SamplingParams(n=1, best_of=3)
    assert info.value.param == "best_of"
