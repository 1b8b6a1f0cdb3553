"""The one pairing rule of /v1/score and LLM.score (vLLM's: one text against each of the others, or
two lists of one length zipped)."""

import pytest

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.pooling.score_pairs import pair_up

NAMES = ("text_1", "text_2")


def test_one_against_many_and_zipped_lists():
    assert pair_up(["q"], ["a", "b"], NAMES, "text_1") == [("q", "a"), ("q", "b")]
    assert pair_up(["q", "r"], ["a", "b"], NAMES, "text_1") == [("q", "a"), ("r", "b")]


def test_lengths_that_do_not_pair_name_the_param():
    with pytest.raises(InvalidRequestError, match="data_1 has 2 texts and data_2 3: give one data_1") as info:
        pair_up(["q", "r"], ["a", "b", "c"], ("data_1", "data_2"), "data_2")
    assert info.value.param == "data_2"
