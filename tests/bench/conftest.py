"""Shared fixtures for the bench tests: a tiny byte-level BPE tokenizer trained in memory (no files
downloaded), whose decode→encode round trip is not an identity, like real LLM tokenizers."""

from __future__ import annotations

import pytest

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "serving large language models on a small cpu is a test of patience",
    "tokens per second, time to first token, inter token latency",
    "0123456789 !?.,;:()[]{} café naïve 東京 emoji 🙂",
] * 20


@pytest.fixture(scope="session")
def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from fdcli.bench.tokenize import wrap_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return wrap_tokenizers(tok, "tiny-bpe")


class WordTokenizer:
    """One token per space-separated word: chunk texts tokenize to exact, hand-countable counts."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.vocab_size = 1000
        self.special_ids: set[int] = set()

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv.get(i, f"w{i}") for i in ids)


@pytest.fixture
def word_tokenizer():
    return WordTokenizer()
