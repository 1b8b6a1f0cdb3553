"""Fixtures for the bench tests; the helpers live in bench_support.py."""

from __future__ import annotations

import pytest
from bench_support import WordTokenizer, running_server, train_bpe

from fdcli.bench.tokenize import wrap_tokenizers


@pytest.fixture(scope="session")
def bpe_tokenizer():
    return wrap_tokenizers(train_bpe(), "tiny-bpe")


@pytest.fixture
def word_tokenizer():
    return WordTokenizer()


@pytest.fixture
def scripted_server():
    with running_server() as state:
        yield state
