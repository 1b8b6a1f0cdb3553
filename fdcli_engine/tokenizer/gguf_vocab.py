"""Build a `tokenizers.Tokenizer` from the tokenizer metadata of a GGUF file.

Only the key/value header is read (a small sequential parser: gguf.GGUFReader takes about 2 s on a 49k
vocabulary because it maps every array element; this reads the same header in well under a second and
never touches tensor data). Supported: `tokenizer.ggml.model == "gpt2"` (byte-level BPE), which covers
Llama-3, Qwen2 and SmolLM-style files.

Pre-tokenizers follow llama.cpp's `tokenizer.ggml.pre` table: llama.cpp applies its regexes one after the
other, each splitting the pieces the previous one produced, and we mirror that with a Sequence of
isolated Splits followed by a ByteLevel byte-to-unicode mapping.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from fdcli_engine.errors import ModelLoadError

# GPT-2's regex (also what ByteLevel(use_regex=True) applies).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> regexes applied in order (llama.cpp semantics).
PRE_TOKENIZER_SPLITS: dict[str, list[str]] = {
    "default": [_GPT2_SPLIT],
    "gpt2": [_GPT2_SPLIT],
    # smollm/starcoder: every digit is its own piece, then GPT-2's regex on the rest.
    "smollm": [r"\p{N}", _GPT2_SPLIT],
    "starcoder": [r"\p{N}", _GPT2_SPLIT],
    "llama-bpe": [_LLAMA3_SPLIT],
    "llama3": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
    "deepseek-r1-qwen": [_QWEN2_SPLIT],
}

# llama.cpp token types.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_GGUF_MAGIC = b"GGUF"
# GGUF value type -> struct format (little-endian) for scalars.
_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    """Sequential little-endian reader over a buffered file."""

    def __init__(self, f: BinaryIO, path: Path):
        self.f = f
        self.path = path

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ModelLoadError(f"GGUF file {str(self.path)!r} is truncated in its metadata header")
        return data

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALAR_FMT[vtype]
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        (n,) = struct.unpack("<Q", self.take(8))
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = struct.unpack("<IQ", self.take(12))
            if etype == _STRING:
                items = [self.string() for _ in range(count)]
                return items if keep else None
            if etype not in _SCALAR_FMT:
                raise ModelLoadError(f"GGUF file {str(self.path)!r}: unsupported array element type {etype}")
            fmt = _SCALAR_FMT[etype]
            raw = self.take(struct.calcsize(fmt) * count)
            return list(struct.unpack(f"<{count}{fmt}", raw)) if keep else None
        if vtype not in _SCALAR_FMT:
            raise ModelLoadError(f"GGUF file {str(self.path)!r}: unsupported value type {vtype}")
        return self.scalar(vtype)


def read_gguf_metadata(
    path: str | Path, prefixes: tuple[str, ...] = ("tokenizer.", "general.")
) -> dict[str, Any]:
    """Key/value metadata of a GGUF file whose key starts with one of `prefixes`, plus every
    `*.context_length` key (the model's length limit); other values are skipped without decoding."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            r = _Reader(f, path)
            if r.take(4) != _GGUF_MAGIC:
                raise ModelLoadError(f"{str(path)!r} is not a GGUF file (bad magic)")
            (version,) = struct.unpack("<I", r.take(4))
            if version < 2:
                raise ModelLoadError(f"GGUF version {version} of {str(path)!r} is too old (need 2 or later)")
            _n_tensors, n_kv = struct.unpack("<QQ", r.take(16))
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = r.string()
                (vtype,) = struct.unpack("<I", r.take(4))
                keep = key.startswith(prefixes) or key.endswith(".context_length")
                val = r.value(vtype, keep)
                if keep:
                    meta[key] = val
            return meta
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {str(path)!r}: {exc.strerror or exc}") from None


def build_gguf_tokenizer(meta: dict[str, Any], path: Path):
    """A byte-level BPE `tokenizers.Tokenizer` from GGUF tokenizer metadata (model "gpt2")."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(
            f"GGUF tokenizer model {kind!r} in {str(path)!r} is not supported (only byte-level BPE 'gpt2'); "
            "pass --tokenizer with a Hugging Face tokenizer folder"
        )
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    merges: list[str] = meta.get("tokenizer.ggml.merges") or []
    if not tokens or not merges:
        raise ModelLoadError(f"GGUF file {str(path)!r} has no tokenizer vocabulary or merges")
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicated piece keeps its first id, as llama.cpp's lookup does
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelLoadError(f"GGUF file {str(path)!r} has a malformed merge {m!r}")
        pairs.append((a, b))
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))

    pre = meta.get("tokenizer.ggml.pre") or "default"
    splits = PRE_TOKENIZER_SPLITS.get(pre)
    if splits is None:
        raise ModelLoadError(
            f"GGUF pre-tokenizer {pre!r} of {str(path)!r} is not supported "
            f"(known: {', '.join(sorted(PRE_TOKENIZER_SPLITS))}); pass --tokenizer with a HF tokenizer folder"
        )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()

    # Control tokens match whole and are special (skipped on decode); user-defined ones match whole too.
    types: list[int] = meta.get("tokenizer.ggml.token_type") or []
    special = [
        AddedToken(tokens[i], special=True, normalized=False)
        for i, t in enumerate(types)
        if t == TOKEN_TYPE_CONTROL
    ]
    user = [
        AddedToken(tokens[i], special=False, normalized=False)
        for i, t in enumerate(types)
        if t == TOKEN_TYPE_USER_DEFINED
    ]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
    if add_bos or add_eos:
        single, pair, specials = ["$A"], ["$A"], []
        if add_bos:
            bos = tokens[bos_id]
            single, pair = [bos, *single], [bos, *pair, bos, "$B"]
            specials.append((bos, bos_id))
        else:
            pair = [*pair, "$B"]
        if add_eos:
            eos = tokens[eos_id]
            single.append(eos)
            pair.append(eos)
            if eos_id != bos_id:
                specials.append((eos, eos_id))
        tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return tok
