"""Build a `tokenizers.Tokenizer` from the tokenizer metadata of a GGUF file.

Only the key/value header is read, by a small sequential parser: gguf.GGUFReader maps every array
element, which is slow on a large vocabulary (docs/engine-measurements.md); this never touches tensor
data. Supported: `tokenizer.ggml.model == "gpt2"` (byte-level BPE: Llama-3, Qwen2,
SmolLM) and "llama" (SentencePiece with byte fallback: Llama-2, Mistral, TinyLlama).

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
TOKEN_TYPE_NORMAL = 1
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
    """A `tokenizers.Tokenizer` from GGUF tokenizer metadata: byte-level BPE ("gpt2") or SentencePiece
    ("llama": pieces with scores, `▁` for spaces, <0xXX> byte fallback)."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise ModelLoadError(f"GGUF file {str(path)!r} has no tokenizer vocabulary")
    if kind == "gpt2":
        tok = _byte_level_bpe(meta, tokens, path)
        add_bos_default = False
    elif kind == "llama":
        tok = _sentencepiece_bpe(meta, tokens, path)
        add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary unless told otherwise
    else:
        raise ModelLoadError(
            f"GGUF tokenizer model {kind!r} in {str(path)!r} is not supported (byte-level BPE 'gpt2' and "
            "SentencePiece 'llama' are); pass --tokenizer with a Hugging Face tokenizer folder"
        )
    _add_special_tokens(tok, tokens, meta.get("tokenizer.ggml.token_type") or [])
    _set_post_processor(tok, tokens, meta, add_bos_default)
    return tok


def _first_ids(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, piece in enumerate(tokens):
        vocab.setdefault(piece, i)  # a duplicated piece keeps its first id, as llama.cpp's lookup does
    return vocab


def _byte_level_bpe(meta: dict[str, Any], tokens: list[str], path: Path):
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    merges: list[str] = meta.get("tokenizer.ggml.merges") or []
    if not merges:
        raise ModelLoadError(f"GGUF file {str(path)!r} has a byte-level vocabulary but no merges")
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelLoadError(f"GGUF file {str(path)!r} has a malformed merge {m!r}")
        pairs.append((a, b))
    tok = HFTokenizer(models.BPE(vocab=_first_ids(tokens), merges=pairs, fuse_unk=False))
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
    return tok


def _sentencepiece_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """BPE merges equivalent to SentencePiece's score-driven merging.

    SentencePiece repeatedly joins the adjacent pair whose joined piece has the highest score. As BPE
    merges: every split (left, right) of a normal piece whose halves are both pieces, ranked by the joined
    piece's score (higher first); ties by longer left then longer right half, then piece id, then half ids.
    """
    vocab = _first_ids(tokens)
    ranked = []
    for pid, piece in enumerate(tokens):
        if types and types[pid] not in (TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED):
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append(
                    (-scores[pid], -len(left), -len(right), pid, vocab[left], vocab[right], left, right)
                )
    ranked.sort()
    return [(r[6], r[7]) for r in ranked]


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str], path: Path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    scores = meta.get("tokenizer.ggml.scores")
    if not scores or len(scores) != len(tokens):
        raise ModelLoadError(
            f"GGUF file {str(path)!r} has a SentencePiece vocabulary without one score per piece"
        )
    types = meta.get("tokenizer.ggml.token_type") or []
    merges = meta.get("tokenizer.ggml.merges")
    pairs = (
        [tuple(m.split(" ", 1)) for m in merges] if merges else _sentencepiece_merges(tokens, scores, types)
    )
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = HFTokenizer(
        models.BPE(vocab=_first_ids(tokens), merges=pairs, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # Spaces become "▁"; with add_space_prefix the text's first piece also gets a leading "▁".
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_space_prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))  # the prefix space added on encode
    tok.decoder = decoders.Sequence(steps)
    return tok


def _add_special_tokens(tok: Any, tokens: list[str], types: list[int]) -> None:
    """Control tokens match whole and are special (skipped on decode); user-defined ones match whole too."""
    from tokenizers import AddedToken

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


def _set_post_processor(tok: Any, tokens: list[str], meta: dict[str, Any], add_bos_default: bool) -> None:
    """BOS/EOS around encoded text as tokenizer.ggml.add_bos_token / add_eos_token say."""
    from tokenizers import processors

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
    if not (add_bos or add_eos):
        return
    bos = [tokens[bos_id]] if add_bos else []
    eos = [tokens[eos_id]] if add_eos else []
    specials = [(tokens[bos_id], bos_id)] if add_bos else []
    if add_eos and not (add_bos and eos_id == bos_id):
        specials.append((tokens[eos_id], eos_id))
    tok.post_processor = processors.TemplateProcessing(
        single=[*bos, "$A", *eos], pair=[*bos, "$A", *eos, *bos, "$B", *eos], special_tokens=specials
    )
