"""Loading a tokenizer for counting and generating prompt tokens, with clean fallbacks.

Order: fd's own tokenizer (`fdcli_engine.tokenizer.Tokenizer.from_model`, which reads HF folders and
GGUF files), then a bare `tokenizer.json` through the `tokenizers` library, then transformers'
AutoTokenizer from local files. None of them downloads anything. If all fail the benchmark still runs
on datasets that do not need token lengths and counts output tokens from the server's `usage`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class BenchTokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class _Adapter:
    """Uniform `encode(text)` (no special tokens) / `decode(ids)` / `vocab_size` over any backend."""

    def __init__(
        self, encode, decode, vocab_size: int, special_ids=(), name: str = "", chat_template=None
    ) -> None:
        self._encode = encode
        self._decode = decode
        self.vocab_size = int(vocab_size)
        self.special_ids = set(special_ids)
        self.name = name
        # (messages, **chat_template_kwargs) -> prompt text with the generation prompt; None when the
        # tokenizer has no template.
        self.render_chat = chat_template

    def encode(self, text: str) -> list[int]:
        return list(self._encode(text))

    def decode(self, ids: list[int]) -> str:
        return self._decode(list(ids))


def wrap_fd_tokenizer(tok: Any, name: str = "") -> _Adapter:
    # fd's Tokenizer exposes `special_tokens` ({id: text}); others may expose `all_special_ids`.
    special = getattr(tok, "special_tokens", None) or getattr(tok, "all_special_ids", None) or ()
    chat = None
    if getattr(tok, "chat_template", None):
        chat = lambda messages, **kw: tok.apply_chat_template(messages, add_generation_prompt=True, **kw)  # noqa: E731
    return _Adapter(
        lambda text: tok.encode(text, add_special_tokens=False),
        tok.decode,
        tok.vocab_size,
        special,
        name,
        chat,
    )


def wrap_tokenizers(tok: Any, name: str = "") -> _Adapter:
    """Wrap a `tokenizers.Tokenizer`."""
    special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special]
    return _Adapter(
        lambda text: tok.encode(text, add_special_tokens=False).ids,
        lambda ids: tok.decode(ids, skip_special_tokens=True),
        tok.get_vocab_size(),
        special,
        name,
    )


def _from_fd(path: str) -> _Adapter:
    from fdcli_engine.tokenizer import Tokenizer  # noqa: PLC0415 - optional, written in parallel

    return wrap_fd_tokenizer(Tokenizer.from_model(path), path)


def _from_tokenizer_json(path: str) -> _Adapter:
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if file.suffix != ".json" or not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    return wrap_tokenizers(Tokenizer.from_file(str(file)), path)


def _from_transformers(path: str) -> _Adapter:
    from transformers import AutoTokenizer

    p = Path(path)
    if p.suffix == ".gguf":
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    chat = None
    if getattr(tok, "chat_template", None):
        chat = lambda messages, **kw: tok.apply_chat_template(  # noqa: E731
            messages, add_generation_prompt=True, tokenize=False, **kw
        )
    return _Adapter(
        lambda text: tok.encode(text, add_special_tokens=False),
        lambda ids: tok.decode(ids, skip_special_tokens=True),
        len(tok),
        tok.all_special_ids,
        path,
        chat,
    )


def local_path(name: str) -> str | None:
    """`name` as a local path, by fd serve's own rule (config.resolve_model_path: a path as given, or a
    Hugging Face id's snapshot in the local cache); None when it is neither."""
    from fdcli_engine.config import resolve_model_path
    from fdcli_engine.errors import ConfigError

    try:
        return str(resolve_model_path(name))
    except ConfigError:
        return None


def load_tokenizer(path: str | None) -> tuple[_Adapter | None, str]:
    """Return (tokenizer or None, a one-line note on where it came from or why there is none)."""
    if not path:
        return None, "no tokenizer given"
    local = local_path(path)
    if local is None:
        return None, f"tokenizer {path!r} is neither a local path nor in the Hugging Face cache"
    path = local
    reasons = []
    for loader in (_from_fd, _from_tokenizer_json, _from_transformers):
        try:
            return loader(path), f"tokenizer from {path}"
        except Exception as exc:  # each backend fails in its own way; the next one may succeed
            reasons.append(f"{loader.__name__.strip('_')}: {type(exc).__name__}")
    return None, f"could not load a tokenizer from {path} ({'; '.join(reasons)})"


def default_tokenizer_path(served_model: str | None) -> str | None:
    """The tokenizer to use when --tokenizer is not given: the served model if it is a local path or a
    Hugging Face id in the local cache (fd and vLLM report the name they were started with), else fd's
    installed default model."""
    if served_model and local_path(served_model) is not None:
        return served_model
    try:
        from fdcli_engine.config import default_model_path

        return str(default_model_path())
    except Exception:  # the default model package is optional
        return None
