"""Request lists for `fd bench serve`: random, sharegpt, custom, prefix-repetition and hf.

Every loader returns `SampleRequest`s in a reproducible order for a given seed. `prompt_len` is the
prompt's length under the benchmark tokenizer (None when there is none: the server's `usage` fills it).
Random prompts are built from random token ids, decoded, re-encoded and adjusted until they re-tokenize
to exactly the requested length, because decode→encode is not an identity for BPE tokenizers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from fdcli_engine.errors import ConfigError

DATASET_NAMES = ("random", "sharegpt", "custom", "prefix-repetition", "hf")
# vLLM's spellings of the same datasets.
DATASET_ALIASES = {"prefix_repetition": "prefix-repetition"}
MAX_FIT_ROUNDS = 64
HF_PROMPT_COLUMNS = ("prompt", "question", "instruction", "input", "text")


@dataclass
class SampleRequest:
    prompt: str
    prompt_len: int | None
    output_len: int


@dataclass
class DatasetOptions:
    name: str = "random"
    path: str | None = None
    random_input_len: int = 128
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    sharegpt_output_len: int | None = None
    custom_output_len: int = 256
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    hf_split: str = "train"
    hf_subset: str | None = None
    hf_prompt_column: str | None = None
    hf_output_len: int = 256
    # vLLM's dataset flags: keep the file's order; never repeat prompts to reach --num-prompts;
    # send custom prompts as written instead of in the tokenizer's chat template.
    disable_shuffle: bool = False
    no_oversample: bool = False
    skip_chat_template: bool = False
    # vLLM's --chat-template-kwargs: extra variables for the client-side chat template (custom).
    chat_template_kwargs: dict | None = None


def _rng(seed: int):
    import numpy as np

    return np.random.default_rng(seed)


def _need_tokenizer(tokenizer, name: str):
    if tokenizer is None:
        raise ConfigError(
            f"the {name} dataset needs a tokenizer to build prompts of exact token lengths: "
            "pass --tokenizer PATH (an HF folder, tokenizer.json or .gguf file)"
        )
    return tokenizer


def _sample_ids(tokenizer, rng, n: int) -> list[int]:
    if n <= 0:
        return []
    ids = rng.integers(0, tokenizer.vocab_size, size=n * 2).tolist()
    special = getattr(tokenizer, "special_ids", set())
    ids = [i for i in ids if i not in special][:n]
    return ids if len(ids) == n else ids + _sample_ids(tokenizer, rng, n - len(ids))


def fit_text(tokenizer, rng, head: str, target_len: int, num_new: int) -> str:
    """Text `head + tail` whose encoding has exactly `target_len` tokens; the tail is random tokens.

    Adjusts the tail: drop ids when too long, append fresh random ids when too short. Each round draws
    new ids, so the loop does not cycle; a fresh start is made if the rounds run out.
    """
    for _restart in range(4):
        ids = _sample_ids(tokenizer, rng, num_new)
        for _ in range(MAX_FIT_ROUNDS):
            text = head + tokenizer.decode(ids)
            n = len(tokenizer.encode(text))
            if n == target_len:
                return text
            if n > target_len:
                ids = ids[: max(len(ids) - (n - target_len), 0)]
            else:
                ids = ids + _sample_ids(tokenizer, rng, target_len - n)
    raise ConfigError(f"could not build a prompt of exactly {target_len} tokens with this tokenizer")


def _range(rng, center: int, ratio: float) -> int:
    lo = max(int(center * (1 - ratio)), 1)
    hi = max(int(center * (1 + ratio)), lo)
    return int(rng.integers(lo, hi + 1))


def random_requests(opts: DatasetOptions, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    """Prompts of prefix_len shared tokens + input_len random tokens (±range ratio), exact lengths."""
    tok = _need_tokenizer(tokenizer, "random")
    if opts.random_input_len < 1 or opts.random_output_len < 1 or opts.random_prefix_len < 0:
        raise ConfigError("--random-input-len and --random-output-len must be positive")
    if not 0 <= opts.random_range_ratio < 1:
        raise ConfigError(f"--random-range-ratio must be in [0, 1), got {opts.random_range_ratio}")
    rng = _rng(seed)
    prefix_len = opts.random_prefix_len
    prefix = fit_text(tok, rng, "", prefix_len, prefix_len) if prefix_len else ""
    out = []
    for _ in range(num):
        in_len = _range(rng, opts.random_input_len, opts.random_range_ratio)
        out_len = _range(rng, opts.random_output_len, opts.random_range_ratio)
        prompt = fit_text(tok, rng, prefix, prefix_len + in_len, in_len)
        out.append(SampleRequest(prompt, prefix_len + in_len, out_len))
    return out


def prefix_repetition_requests(opts: DatasetOptions, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    """N shared random prefixes, each followed by random suffixes; shuffled so prefixes interleave."""
    tok = _need_tokenizer(tokenizer, "prefix-repetition")
    p_len, s_len = opts.prefix_repetition_prefix_len, opts.prefix_repetition_suffix_len
    n_prefixes = opts.prefix_repetition_num_prefixes
    if p_len < 1 or s_len < 1 or n_prefixes < 1 or opts.prefix_repetition_output_len < 1:
        raise ConfigError("--prefix-repetition-* lengths and counts must be positive")
    rng = _rng(seed)
    prefixes = [fit_text(tok, rng, "", p_len, p_len) for _ in range(n_prefixes)]
    out = [
        SampleRequest(
            fit_text(tok, rng, prefixes[i % n_prefixes], p_len + s_len, s_len),
            p_len + s_len,
            opts.prefix_repetition_output_len,
        )
        for i in range(num)
    ]
    order = rng.permutation(num).tolist()
    return [out[i] for i in order]


def _read_path(opts: DatasetOptions) -> Path:
    if not opts.path:
        raise ConfigError(f"the {opts.name} dataset needs --dataset-path FILE")
    p = Path(opts.path).expanduser()
    if not p.exists():
        raise ConfigError(f"--dataset-path {opts.path!r} does not exist")
    return p


def _count(tokenizer, text: str) -> int | None:
    return len(tokenizer.encode(text)) if tokenizer is not None else None


def _pick(items: list, num: int, seed: int, opts: DatasetOptions) -> list:
    """`num` items in a seeded shuffled order (file order with --disable-shuffle), cycling when the
    source has fewer than `num` (with --no-oversample: each item once, so fewer requests)."""
    if not items:
        raise ConfigError("the dataset holds no usable prompts")
    if opts.disable_shuffle:
        order = list(range(len(items)))
    else:
        order = _rng(seed).permutation(len(items)).tolist()
    if opts.no_oversample:
        num = min(num, len(items))
    return [items[order[i % len(items)]] for i in range(num)]


def sharegpt_requests(opts: DatasetOptions, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    """First human turn as the prompt; the first reply's token count as the output length."""
    p = _read_path(opts)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--dataset-path {opts.path!r} is not a ShareGPT JSON file: {exc}") from None
    if not isinstance(data, list):
        raise ConfigError(f"--dataset-path {opts.path!r}: expected a JSON list of conversations")
    pairs = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        prompt, reply = (t.get("value") if isinstance(t, dict) else None for t in turns[:2])
        if isinstance(prompt, str) and isinstance(reply, str) and prompt and reply:
            pairs.append((prompt, reply))
    if opts.sharegpt_output_len is None and tokenizer is None:
        raise ConfigError("the sharegpt dataset needs --tokenizer or --sharegpt-output-len N")
    out = []
    for prompt, reply in _pick(pairs, num, seed, opts):
        out_len = opts.sharegpt_output_len or max(len(tokenizer.encode(reply)), 1)
        out.append(SampleRequest(prompt, _count(tokenizer, prompt), out_len))
    return out


def custom_requests(opts: DatasetOptions, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    """JSONL lines `{"prompt": str, "output_tokens": int?}`; --custom-output-len for lines without one."""
    p = _read_path(opts)
    rows = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{opts.path}:{lineno}: not valid JSON ({exc.msg})") from None
            prompt = row.get("prompt") if isinstance(row, dict) else None
            n_out = row.get("output_tokens", opts.custom_output_len) if isinstance(row, dict) else None
            if not isinstance(prompt, str) or not prompt:
                raise ConfigError(f"{opts.path}:{lineno}: expected a non-empty string field 'prompt'")
            if not isinstance(n_out, int) or isinstance(n_out, bool) or n_out < 1:
                raise ConfigError(f"{opts.path}:{lineno}: 'output_tokens' must be a positive integer")
            rows.append((prompt, n_out))
    picked = _pick(rows, num, seed, opts)
    if not opts.skip_chat_template:
        kwargs = opts.chat_template_kwargs or {}
        picked = [(_in_chat_template(tokenizer, pr, kwargs), n) for pr, n in picked]
    return [SampleRequest(pr, _count(tokenizer, pr), n) for pr, n in picked]


def _in_chat_template(tokenizer, prompt: str, kwargs: dict) -> str:
    """The prompt as one user turn in the tokenizer's chat template, generation prompt included.

    vLLM's custom dataset does this for every backend unless --skip-chat-template (older vLLM:
    --custom-skip-chat-template); with --backend openai-chat the server then templates it once more,
    which is why vLLM users pass the flag there.
    """
    render = getattr(tokenizer, "render_chat", None)
    if render is None:
        why = "there is no tokenizer" if tokenizer is None else "the tokenizer has no chat template"
        raise ConfigError(
            f"the custom dataset wraps each prompt in the tokenizer's chat template (as vLLM does) but {why}: "
            "pass --tokenizer PATH of a chat model, or --skip-chat-template to send the prompts as written"
        )
    return render([{"role": "user", "content": prompt}], **kwargs)


def _load_hf(opts: DatasetOptions):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # fd never downloads: local path or cache only
    import datasets

    path = opts.path
    if not path:
        raise ConfigError("the hf dataset needs --dataset-path (a local path or a cached dataset name)")
    p = Path(path).expanduser()
    builders = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
    try:
        if p.is_dir() and any((p / f).exists() for f in ("state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                if opts.hf_split not in ds:
                    raise ConfigError(f"--hf-split {opts.hf_split!r} not in {sorted(ds)}")
                ds = ds[opts.hf_split]
            return ds
        if p.is_file() and p.suffix in builders:
            return datasets.load_dataset(builders[p.suffix], data_files=str(p), split="train")
        return datasets.load_dataset(str(p) if p.exists() else path, name=opts.hf_subset, split=opts.hf_split)
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many types (FileNotFoundError, ConnectionError, ValueError)
        raise ConfigError(f"cannot load hf dataset {path!r}: {type(exc).__name__}: {exc}") from None


def _prompt_text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # chat-style column: the first user message
        for msg in value:
            if isinstance(msg, dict) and msg.get("role", msg.get("from")) in ("user", "human"):
                text = msg.get("content", msg.get("value"))
                return text if isinstance(text, str) else None
    return None


def hf_requests(opts: DatasetOptions, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    ds = _load_hf(opts)
    columns = list(ds.column_names)
    column = opts.hf_prompt_column or next((c for c in HF_PROMPT_COLUMNS if c in columns), None)
    if column is None or column not in columns:
        raise ConfigError(f"--hf-prompt-column {column!r}: choose one of the dataset's columns {columns}")
    prompts = [t for t in map(_prompt_text, ds[column]) if t]
    picked = _pick(prompts, num, seed, opts)
    return [SampleRequest(pr, _count(tokenizer, pr), opts.hf_output_len) for pr in picked]


LOADERS = {
    "random": random_requests,
    "sharegpt": sharegpt_requests,
    "custom": custom_requests,
    "prefix-repetition": prefix_repetition_requests,
    "hf": hf_requests,
}


def canonical_name(name: str) -> str:
    """fd's name of a dataset given in fd's or vLLM's spelling."""
    return DATASET_ALIASES.get(name, name)


def build_requests(opts: DatasetOptions, tokenizer, num: int, seed: int) -> list[SampleRequest]:
    opts = dataclasses.replace(opts, name=canonical_name(opts.name))
    if opts.name not in LOADERS:
        raise ConfigError(f"--dataset {opts.name!r}: choose one of {', '.join(DATASET_NAMES)}")
    if num < 1:
        raise ConfigError(f"--num-prompts must be at least 1, got {num}")
    return LOADERS[opts.name](opts, tokenizer, num, seed)
