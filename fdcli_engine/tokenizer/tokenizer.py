"""The model's tokenizer: one class over the `tokenizers` library for HF folders and GGUF files.

Sources of truth, in order:
- HF folder: tokenizer.json (vocabulary, pre/post-processing — a BOS the model wants is added by its
  post-processor), tokenizer_config.json (bos/eos, chat_template, model_max_length), chat_template.jinja /
  chat_template.json (newer layout, wins over tokenizer_config's), generation_config.json (extra eos ids).
- GGUF file: tokenizer.ggml.* metadata (see gguf_vocab.py) and tokenizer.chat_template.
Leaf module: imports only fd's errors and the tokenizer package's own modules.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fdcli_engine.errors import InvalidRequestError, ModelLoadError
from fdcli_engine.tokenizer.chat_template import render_chat_template

DEFAULT_MAX_LENGTH = 8192
# SentencePiece byte-fallback pieces: <0x00> .. <0xFF>.
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# transformers writes this sentinel when a tokenizer has no length limit.
_HF_NO_LIMIT = int(1e20)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot parse {str(path)!r}: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any) -> str | None:
    """chat_template may be a string or a list of {"name", "template"}: use the 'default' one."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


@functools.lru_cache(maxsize=1)
def _byte_level_inverse() -> dict[str, int]:
    """Byte-level BPE alphabet: printable char -> the byte it stands for (GPT-2's reversible mapping)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {chr(b): b for b in printable}
    # Bytes without a printable form are shifted, in order, to code points from 256 upward.
    shifted = (b for b in range(256) if b not in printable)
    for offset, b in enumerate(shifted):
        mapping[chr(256 + offset)] = b
    return mapping


class Tokenizer:
    """Encode/decode text and render chat prompts for one model."""

    def __init__(
        self,
        backend: Any,
        *,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        chat_template: str | None,
        model_max_length: int,
        name: str = "",
    ):
        self._tok = backend  # a tokenizers.Tokenizer
        # Ids without offsets where the library has it (tokenizers >= 0.20): the same ids, no offsets.
        self._encode_batch = getattr(backend, "encode_batch_fast", backend.encode_batch)
        self.bos_token_id = bos_token_id
        eos_token_ids = list(eos_token_ids)  # ordered: the first is the file's own eos
        self.eos_token_ids = set(eos_token_ids)
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        self.name = name
        # id -> content for tokens the backend treats as special (skipped on decode).
        self.special_tokens: dict[int, str] = {
            i: t.content for i, t in backend.get_added_tokens_decoder().items() if t.special
        }
        # The first eos id is the primary one (the file's eos; generation_config ids only extend the set).
        self._eos_token_id = next(iter(eos_token_ids), None)
        # SentencePiece byte-fallback pieces (<0xXX>): the decoder turns a whole run of them into text at
        # once, so a streaming detokenizer must not cut a run (see IncrementalDetokenizer).
        self.byte_fallback_ids: frozenset[int] = frozenset()
        if "ByteFallback" in repr(backend.decoder):
            vocab = backend.get_vocab(with_added_tokens=False)
            self.byte_fallback_ids = frozenset(i for t, i in vocab.items() if _BYTE_PIECE.fullmatch(t))

    # --- construction -------------------------------------------------------------------------------
    @classmethod
    def from_model(cls, path: str | Path) -> Tokenizer:
        """Load from an HF tokenizer folder or a .gguf file."""
        p = Path(path).expanduser()
        if p.is_file() and p.suffix.lower() == ".gguf":
            return cls._from_gguf(p)
        if p.is_dir():
            if (p / "tokenizer.json").is_file():
                return cls._from_hf_folder(p)
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return cls._from_gguf(ggufs[0])
            raise ModelLoadError(f"no tokenizer.json in {str(p)!r} (fd reads fast tokenizers only)")
        if not p.exists():
            raise ModelLoadError(f"tokenizer path {str(p)!r} does not exist")
        raise ModelLoadError(f"{str(p)!r} is neither a tokenizer folder nor a .gguf file")

    @classmethod
    def _from_gguf(cls, path: Path) -> Tokenizer:
        from fdcli_engine.tokenizer.gguf_vocab import build_gguf_tokenizer, read_gguf_metadata

        meta = read_gguf_metadata(path)
        backend = build_gguf_tokenizer(meta, path)
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eos_ids = [eos] if eos is not None else []
        # Chat models often end turns with a token other than the file's eos (e.g. <|eot_id|>).
        eot = meta.get("tokenizer.ggml.eot_token_id")
        if eot is not None and eot not in eos_ids:
            eos_ids.append(eot)
        return cls(
            backend,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=dict.fromkeys(eos_ids),
            chat_template=meta.get("tokenizer.chat_template"),
            model_max_length=int(
                meta.get(f"{meta.get('general.architecture')}.context_length") or DEFAULT_MAX_LENGTH
            ),
            name=path.name,
        )

    @classmethod
    def _from_hf_folder(cls, folder: Path) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            backend = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a plain Exception on malformed files
            raise ModelLoadError(f"cannot load {str(folder / 'tokenizer.json')!r}: {exc}") from None
        # Padding/truncation saved in tokenizer.json (MiniLM pads to 128) would silently change prompts;
        # length limits are the engine's job and are reported as errors there.
        backend.no_padding()
        backend.no_truncation()
        cfg = _read_json(folder / "tokenizer_config.json")
        special_map = _read_json(folder / "special_tokens_map.json")

        def token_id(key: str) -> int | None:
            content = _token_content(cfg.get(key)) or _token_content(special_map.get(key))
            return backend.token_to_id(content) if content is not None else None

        # add_bos_token/add_eos_token in tokenizer_config are not applied: tokenizer.json's post-processor
        # decides, as in transformers 5 (the reference), which keeps it even when the flags disagree.

        eos_ids: list[int] = []
        if (eos := token_id("eos_token")) is not None:
            eos_ids.append(eos)
        gen_eos = _read_json(folder / "generation_config.json").get("eos_token_id")
        for i in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if isinstance(i, int) and i not in eos_ids:
                eos_ids.append(i)

        template = _pick_template(cfg.get("chat_template"))
        if (folder / "chat_template.json").is_file():
            template = (
                _pick_template(_read_json(folder / "chat_template.json").get("chat_template")) or template
            )
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")

        max_len = cfg.get("model_max_length")
        if not isinstance(max_len, (int, float)) or max_len >= _HF_NO_LIMIT:
            max_len = DEFAULT_MAX_LENGTH
        return cls(
            backend,
            bos_token_id=token_id("bos_token"),
            eos_token_ids=dict.fromkeys(eos_ids),
            chat_template=template,
            model_max_length=int(max_len),
            name=folder.name,
        )

    def save_pretrained(self, folder: str | Path) -> list[Path]:
        """Write this tokenizer as an HF tokenizer folder (tokenizer.json, tokenizer_config.json, and
        generation_config.json when there are several eos ids) that `from_model` and transformers'
        AutoTokenizer load back to the same ids, specials and chat template: a GGUF model's tokenizer for
        tools that read only HF folders (vLLM's `bench serve --tokenizer`). Returns the files written."""
        out = Path(folder).expanduser()
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ModelLoadError(f"cannot create {str(out)!r}: {exc.strerror or exc}") from None
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": self.model_max_length,
            # tokenizer.json's post-processor adds what the model wants, as from_model reads it back.
            "add_bos_token": False,
            "add_eos_token": False,
        }
        if self.bos_token is not None:
            config["bos_token"] = self.bos_token
        if self.eos_token is not None:
            config["eos_token"] = self.eos_token
        if self.chat_template:
            config["chat_template"] = self.chat_template
        files = {"tokenizer_config.json": config}
        extra_eos = sorted(self.eos_token_ids - {self._eos_token_id})
        if extra_eos:
            files["generation_config.json"] = {"eos_token_id": [self._eos_token_id, *extra_eos]}
        written = [out / "tokenizer.json"]
        try:
            self._tok.save(str(written[0]))
            for name, data in files.items():
                (out / name).write_text(
                    json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
                )
                written.append(out / name)
        except OSError as exc:
            raise ModelLoadError(f"cannot write to {str(out)!r}: {exc.strerror or exc}") from None
        return written

    # --- properties ---------------------------------------------------------------------------------
    @property
    def backend(self) -> Any:
        return self._tok

    @property
    def vocab_size(self) -> int:
        """Number of ids (base vocabulary plus added tokens)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self._eos_token_id

    @property
    def bos_token(self) -> str | None:
        return self._tok.id_to_token(self.bos_token_id) if self.bos_token_id is not None else None

    @property
    def eos_token(self) -> str | None:
        return self._tok.id_to_token(self._eos_token_id) if self._eos_token_id is not None else None

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    # --- encode / decode ----------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise InvalidRequestError(f"text to encode must be a string, got {type(text).__name__}")
        # A batch of one: the tokenizers library holds the GIL through `encode` but releases it in its
        # batch calls (same ids), so a prompt tokenized on a worker thread leaves the server's event loop
        # running; the fast batch call also skips the offsets (~20% of a 500-token encode).
        return self._encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_pair(
        self, text: str, text_pair: str, max_length: int | None = None
    ) -> tuple[list[int], list[int]]:
        """A text pair as one sequence, the tokenizer's pair template applied (BERT: [CLS] a [SEP] b
        [SEP]; a tokenizer without one concatenates): (ids, token type ids). `max_length` truncates
        as transformers' `tokenizer(a, b, truncation=True, max_length=...)` does (longest first,
        special tokens kept)."""
        if max_length is None:
            enc = self._tok.encode(text, text_pair, add_special_tokens=True)
            return enc.ids, enc.type_ids
        # The backend's truncation is state; nothing awaits between setting and clearing it.
        self._tok.enable_truncation(max_length, strategy="longest_first")
        try:
            enc = self._tok.encode(text, text_pair, add_special_tokens=True)
        finally:
            self._tok.no_truncation()
        return enc.ids, enc.type_ids

    def encode_batch(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=add_special_tokens)]

    def _check_ids(self, ids: list[int]) -> None:
        n = self.vocab_size
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < n:
                raise InvalidRequestError(f"token id {i!r} is out of range [0, {n})", param="token_ids")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        ids = list(ids)
        self._check_ids(ids)
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        ids = list(ids)
        self._check_ids(ids)
        return [self._tok.id_to_token(i) for i in ids]

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one id stands for (logprobs `bytes`, token display). Exact for byte-level BPE and
        SentencePiece byte fallback, where a token may hold part of a UTF-8 character; a SentencePiece
        piece keeps its leading space; anything else gives the token's decoded UTF-8 text."""
        self._check_ids([token_id])
        piece = self._tok.id_to_token(token_id)
        decoder = repr(self._tok.decoder)
        if token_id not in self.special_tokens:
            if "ByteLevel" in decoder:
                byte_of = _byte_level_inverse()
                if all(ch in byte_of for ch in piece):
                    return bytes(byte_of[ch] for ch in piece)
            elif "ByteFallback" in decoder:
                if _BYTE_PIECE.fullmatch(piece):
                    return bytes([int(piece[3:5], 16)])
                return piece.replace("\u2581", " ").encode("utf-8")
        return self._tok.decode([token_id], skip_special_tokens=False).encode("utf-8", errors="replace")

    # --- chat ---------------------------------------------------------------------------------------
    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        **template_kwargs: Any,
    ) -> str:
        template = chat_template or self.chat_template
        if not template:
            raise InvalidRequestError(
                f"model {self.name!r} has no chat template: use the completions API, or pass a chat_template",
                param="messages",
            )
        specials = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        return render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            special_tokens=specials,
            **template_kwargs,
        )

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size})"
