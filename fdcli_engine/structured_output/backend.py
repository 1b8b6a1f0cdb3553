"""The grammar-backend interface: compile a constraint once, then one matcher per request that
accepts sampled tokens and writes the next step's allowed-token bitmask.

Bitmask layout (shared by every backend, llguidance's and xgrammar's): int32 [rows, ceil(V / 32)],
bit j of word w allows token 32 * w + j; V is the model's vocabulary (the logits' width), so ids the
tokenizer does not have are never allowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from fdcli_engine.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from fdcli_engine.structured_output.params import StructuredOutputsParams

# FastDeploy's --guided-decoding-backend values; vLLM's --structured-outputs-config backend names.
BACKEND_NAMES = ("auto", "guidance", "xgrammar", "off")


class GrammarMatcher(Protocol):
    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False when the grammar does not allow it."""

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """Write the tokens allowed next into row `row` of `bitmask`."""

    def is_terminated(self) -> bool:
        """The grammar is complete and allows nothing but EOS."""

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (rejected speculative drafts)."""


class CompiledGrammar(Protocol):
    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the grammar's start."""


class GrammarBackend(Protocol):
    name: str
    vocab_size: int

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled constraint (cached); InvalidRequestError (param "structured_outputs") when it is
        invalid, matches nothing, or exceeds the compile budget."""

    def allocate_bitmask(self, num_rows: int) -> np.ndarray:
        """An all-allowed bitmask of `num_rows` rows."""

    def stats(self) -> dict:
        """Counters: compiles, cache_hits, compile_errors, compile_seconds, cached, cached_chars."""


def check_backend_name(name: str) -> None:
    """ConfigError unless `name` is a backend fd can run: said at config validation, before any model
    or library loads."""
    if name == "xgrammar":
        raise ConfigError("--guided-decoding-backend xgrammar is not available in fd: use guidance (or auto)")
    if name not in BACKEND_NAMES:
        raise ConfigError(
            f"--guided-decoding-backend {name!r} is not known: choose one of {', '.join(BACKEND_NAMES)}"
        )


def get_backend(name: str, tokenizer, vocab_size: int) -> GrammarBackend | None:
    """The backend `name` names (None for "off") over the model's tokenizer; `vocab_size` is the
    logits' width. "auto" is llguidance, the backend fd installs."""
    check_backend_name(name)
    if name == "off":
        return None
    from fdcli_engine.structured_output.guidance import GuidanceBackend  # noqa: PLC0415

    return GuidanceBackend(tokenizer, vocab_size)
