"""Tiny random-weight checkpoints and paged-attention helpers shared by tests.

- `make_tiny_checkpoint(arch, folder)`: a transformers model with every parameter randomized (HF
  initializes biases to 0 and norms to 1, which would hide bias and norm bugs), saved as safetensors.
- `write_tiny_tokenizer(folder)`: a byte-level BPE tokenizer.json + tokenizer_config.json with a
  ChatML-style template; its vocab (< 300) fits every tiny model's vocab (512).
- `make_attention_metadata(seqs, block_size)`: AttentionMetadata + positions for a varlen batch.
- `PagedRunner`: drives a model step by step over a paged KV cache with scattered block ids.

Import from a test with `sys.path` holding tests/ (tests/models/conftest.py does this).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TINY_DIMS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def make_tiny_checkpoint(arch: str, folder: str | Path, seed: int = 0, **overrides) -> Path:
    """Build and save a tiny `arch` model (transformers class name) in `folder`; returns the folder.
    `overrides` replace config fields (e.g. tie_word_embeddings=True, rope_scaling={...})."""
    import torch  # noqa: PLC0415 - torch/transformers are test-only dependencies
    import transformers  # noqa: PLC0415

    folder = Path(folder)
    torch.manual_seed(seed)
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    dims = dict(TINY_DIMS, rope_theta=10000.0)
    if arch == "Qwen3ForCausalLM":
        dims["head_dim"] = 32  # != hidden / heads (16): exercises the explicit head_dim path
    dims.update(overrides)
    rope_scaling = dims.pop("rope_scaling", None)
    theta = dims.pop("rope_theta")
    config = config_cls(**dims)
    # transformers 5 keeps rope settings in rope_parameters.
    config.rope_parameters = {"rope_theta": theta, "rope_type": "default", **(rope_scaling or {})}
    model = getattr(transformers, arch)(config).eval()
    randomize_weights(model)
    model.save_pretrained(folder)
    return folder


def randomize_weights(model, norms: tuple[str, ...] = ("norm.weight",), small: tuple[str, ...] = ()) -> None:
    """Every parameter random from the current torch seed, in named_parameters order: weights ending
    with one of `norms` 1 + 0.2 N, those ending with one of `small` 0.05 N, the rest 0.15 N."""
    import torch  # noqa: PLC0415

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(norms):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif small and name.endswith(small):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))


def add_special_tokens(folder: str | Path, spellings: list[str], chat_template: str) -> dict[str, int]:
    """Add `spellings` as special tokens to the tokenizer in `folder` (after its vocab, in order) and
    make `chat_template` its template; returns each spelling's id."""
    from tokenizers import AddedToken, Tokenizer  # noqa: PLC0415

    folder = Path(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spellings])
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return {t: tok.token_to_id(t) for t in spellings}


def score_head_tensors(hidden: int, num_labels: int, seed: int) -> dict:
    """A random score MLP, score.0 (hidden -> hidden) -> ReLU -> score.2 (hidden -> num_labels), the
    Qwen2.5-Math RM/PRM layout fd's pooling adapters read; torch tensors drawn from seed + 1."""
    import torch  # noqa: PLC0415

    g = torch.Generator().manual_seed(seed + 1)
    return {
        "score.0.weight": 0.15 * torch.randn(hidden, hidden, generator=g),
        "score.0.bias": 0.15 * torch.randn(hidden, generator=g),
        "score.2.weight": 0.15 * torch.randn(num_labels, hidden, generator=g),
        "score.2.bias": 0.15 * torch.randn(num_labels, generator=g),
    }


def add_reward_head(folder: str | Path, arch: str, hidden: int, seed: int = 0) -> Path:
    """Turn the saved checkpoint in `folder` into a one-label reward model `arch`: its lm_head
    dropped, score_head_tensors added (no transformers class: the tests compute the head)."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    folder = Path(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors.pop("lm_head.weight", None)
    tensors.update(score_head_tensors(hidden, 1, seed))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=[arch], num_labels=1)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def random_image(width: int, height: int, seed: int = 0):
    """An RGB picture of uniform random pixels."""
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def load_hf_model(folder: str | Path, **kwargs):
    """The transformers model saved in `folder`, eval mode, eager attention (kwargs: e.g. dtype)."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", **kwargs).eval()


def hf_greedy(hf, prompt: list[int], max_new_tokens: int, eos: list[int] | None = None) -> list[int]:
    """transformers' greedy continuation of the token ids `prompt`, the oracle of fd's greedy outputs:
    exactly max_new_tokens tokens when `eos` is None (ignore_eos), else up to the first of `eos`."""
    import torch  # noqa: PLC0415

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens if eos is None else None,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else 0,
        )
    return out[0, len(prompt) :].tolist()


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, this is a tiny tokenizer for tests",
    "user assistant system: what is the answer? 42 is the answer.",
]


def write_tiny_tokenizer(folder: str | Path, vocab_size: int = 300) -> Path:
    """Byte-level BPE trained on a few sentences (deterministic), with <|endoftext|>=0,
    <|im_start|>=1, <|im_end|>=2 and a ChatML chat template. vocab_size must be <= the model's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "model_max_length": TINY_DIMS["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


def make_attention_metadata(seqs: list[tuple[int, int, list[int]]], block_size: int):
    """seqs: per sequence (num_computed_tokens, num_new_tokens, block_ids covering all its tokens).
    Returns (AttentionMetadata, positions int64[T]) for the flattened batch, laid out in that order."""
    import paddle  # noqa: PLC0415

    from fdcli_engine.step_types import AttentionMetadata  # noqa: PLC0415

    positions, slots, starts, seq_lens = [], [], [0], []
    for computed, new, blocks in seqs:
        for p in range(computed, computed + new):
            positions.append(p)
            slots.append(blocks[p // block_size] * block_size + p % block_size)
        starts.append(starts[-1] + new)
        seq_lens.append(computed + new)
    width = max(len(b) for _, _, b in seqs)
    table = np.zeros((len(seqs), width), dtype=np.int32)
    for i, (_, _, blocks) in enumerate(seqs):
        table[i, : len(blocks)] = blocks
    starts_np = np.asarray(starts, dtype=np.int32)
    lens_np = np.asarray(seq_lens, dtype=np.int32)
    meta = AttentionMetadata(
        slot_mapping=paddle.to_tensor(np.asarray(slots, dtype=np.int64)),
        query_start_loc=paddle.to_tensor(starts_np),
        seq_lens=paddle.to_tensor(lens_np),
        block_tables=paddle.to_tensor(table),
        max_query_len=max(n for _, n, _ in seqs),
        max_seq_len=int(lens_np.max()),
        block_size=block_size,
        query_start_loc_np=starts_np,
        seq_lens_np=lens_np,
    )
    return meta, paddle.to_tensor(np.asarray(positions, dtype=np.int64))


class PagedRunner:
    """Runs `model` over a paged KV cache. Block ids are handed out in a shuffled order so that a
    sequence's blocks are never contiguous: the block table indirection is always exercised."""

    def __init__(self, model, num_blocks: int = 64, block_size: int = 4, seed: int = 0):
        import paddle  # noqa: PLC0415

        self.model = model
        self.block_size = block_size
        shape = [num_blocks, model.num_kv_heads, block_size, model.head_dim]
        self.kv_caches = [
            (paddle.zeros(shape, dtype="float32"), paddle.zeros(shape, dtype="float32"))
            for _ in range(model.num_layers)
        ]
        self.free_blocks = list(np.random.default_rng(seed).permutation(num_blocks))
        self.seqs: dict[str, dict] = {}

    def step(self, batch: list[tuple[str, list[int]]]) -> np.ndarray:
        """batch: (seq_id, new token ids) per sequence. Returns logits [T, vocab] for every new token."""
        import paddle  # noqa: PLC0415

        entries, ids = [], []
        for seq_id, new_ids in batch:
            seq = self.seqs.setdefault(seq_id, {"len": 0, "blocks": []})
            total = seq["len"] + len(new_ids)
            while len(seq["blocks"]) * self.block_size < total:
                seq["blocks"].append(int(self.free_blocks.pop()))
            entries.append((seq["len"], len(new_ids), list(seq["blocks"])))
            ids.extend(new_ids)
            seq["len"] = total
        meta, positions = make_attention_metadata(entries, self.block_size)
        input_ids = paddle.to_tensor(np.asarray(ids, dtype=np.int64))
        hidden = self.model.forward(input_ids, positions, self.kv_caches, meta)
        return self.model.compute_logits(hidden).numpy()

    def greedy(self, seq_id: str, prompt: list[int], max_new_tokens: int) -> list[int]:
        logits = self.step([(seq_id, prompt)])
        out = [int(logits[-1].argmax())]
        while len(out) < max_new_tokens:
            out.append(int(self.step([(seq_id, [out[-1]])])[-1].argmax()))
        return out


def load_fd_model(folder: str | Path, **engine_options):
    """fd's model for a checkpoint folder or .gguf file, through the public loader."""
    from fdcli_engine.config import EngineConfig  # noqa: PLC0415
    from fdcli_engine.config_resolver import resolve_config  # noqa: PLC0415
    from fdcli_engine.loader import load_model  # noqa: PLC0415

    return load_model(resolve_config(EngineConfig(model=str(folder), **engine_options)))


_GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
_GGUF_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_tensor_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf_name in top:
        return top[hf_name]
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_LAYER_NAMES[module]}.{kind}"


def llama_cpp_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter row order for Llama q/k: per head, row j of the first half goes to 2j
    and row j of the second half to 2j+1 (its interleaved rotary)."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_tiny_gguf(
    hf_folder: str | Path, path: str | Path, qtype: str = "F32", arch: str | None = None
) -> Path:
    """Convert a tiny HF checkpoint to GGUF the way llama.cpp lays it out (names, metadata, permuted
    Llama q/k rows). qtype "F32", or "Q8_0"/"Q4_0"/"Q4_1" for 2-D weights (norms and biases stay F32).
    `arch` overrides the GGUF architecture name (error-path tests)."""
    import gguf  # noqa: PLC0415
    from safetensors.numpy import load_file  # noqa: PLC0415

    hf_folder, path = Path(hf_folder), Path(path)
    cfg = json.loads((hf_folder / "config.json").read_text())
    arch = arch or _GGUF_ARCH[cfg["architectures"][0]]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(cfg["vocab_size"])])
    quant = getattr(gguf.GGMLQuantizationType, qtype)
    for name, tensor in load_file(hf_folder / "model.safetensors").items():
        tensor = tensor.astype(np.float32)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = llama_cpp_permute(tensor, heads if "q_proj" in name else kv_heads)
        if tensor.ndim == 2 and qtype != "F32":
            w.add_tensor(_gguf_tensor_name(name), gguf.quants.quantize(tensor, quant), raw_dtype=quant)
        else:
            w.add_tensor(_gguf_tensor_name(name), tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_tiny_bert(folder: str | Path, seed: int = 0) -> Path:
    """A tiny random BertModel (hidden 64, 2 layers, 4 heads, vocab 512), every parameter randomized."""
    import torch  # noqa: PLC0415
    from transformers import BertConfig, BertModel  # noqa: PLC0415

    folder = Path(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=128,
    )
    model = BertModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if "LayerNorm" in name else 0.15
            p.copy_((1.0 if name.endswith("LayerNorm.weight") else 0.0) + scale * torch.randn_like(p))
    model.save_pretrained(folder)
    return folder


# --- ERNIE-4.5 with a multi-token-prediction (MTP) layer: tests/spec_decode -----------------------------
# The tiny ERNIE of tests/ernie (dense, untied head), plus a random MTP head as FastDeploy names it
# (models/ernie4_5_mtp.py), in the HF ("-PT") or the Paddle ("-Paddle") layout.
ERNIE_MTP_OVERRIDES = dict(head_dim=16, tie_word_embeddings=False)


def tiny_mtp_tensors(cfg: dict, seed: int = 1) -> dict[str, np.ndarray]:
    """A random MTP head for the config `cfg`, HF names, Linear weights [out, in], fp32."""
    rng = np.random.default_rng(seed)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim

    def norm():
        return (1.0 + 0.2 * rng.standard_normal(hidden)).astype(np.float32)

    def w(rows, cols):
        return (0.15 * rng.standard_normal((rows, cols))).astype(np.float32)

    b = "model.mtp_block.0."
    return {
        "model.mtp_emb_norm.0.weight": norm(),
        "model.mtp_hidden_norm.0.weight": norm(),
        "model.mtp_linear_proj.0.weight": w(hidden, 2 * hidden),
        b + "input_layernorm.weight": norm(),
        b + "post_attention_layernorm.weight": norm(),
        b + "self_attn.q_proj.weight": w(q, hidden),
        b + "self_attn.k_proj.weight": w(kv, hidden),
        b + "self_attn.v_proj.weight": w(kv, hidden),
        b + "self_attn.o_proj.weight": w(hidden, q),
        b + "mlp.gate_proj.weight": w(inter, hidden),
        b + "mlp.up_proj.weight": w(inter, hidden),
        b + "mlp.down_proj.weight": w(hidden, inter),
    }


def to_paddle_names(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF-named ERNIE tensors in FastDeploy's Paddle layout: `model.` -> `ernie.`, Linear weights
    transposed to [in, out], q|k|v fused into qkv_proj and gate|up into up_gate_proj."""
    out: dict[str, np.ndarray] = {}
    for name, w in tensors.items():
        pname = "ernie." + name[len("model.") :] if name.startswith("model.") else name
        if name.endswith("self_attn.q_proj.weight"):
            parts = [w, tensors[name.replace("q_proj", "k_proj")], tensors[name.replace("q_proj", "v_proj")]]
            out[pname.replace("q_proj", "qkv_proj")] = np.concatenate(parts).T
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.up_proj.weight")):
            continue  # fused with their q_proj / gate_proj
        elif name.endswith("mlp.gate_proj.weight"):
            up = tensors[name.replace("gate_proj", "up_proj")]
            out[pname.replace("gate_proj", "up_gate_proj")] = np.concatenate([w, up]).T
        elif w.ndim == 2 and name != "model.embed_tokens.weight":
            out[pname] = w.T
        else:
            out[pname] = w
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def make_tiny_ernie_mtp(
    folder: str | Path,
    layout: str = "paddle",
    mtp: str = "inline",
    seed: int = 0,
    mtp_seed: int = 1,
    arch: str = "Ernie4_5ForCausalLM",
    **overrides,
) -> Path:
    """A tiny ERNIE-4.5 checkpoint (with tokenizer) in `layout` ("hf" or "paddle"); `mtp`: "inline"
    (the head's tensors in the checkpoint), "none", or "folder" (in `folder`/mtp, a separate MTP
    folder: config.json + the head alone, in the same layout). `arch`/`overrides`: e.g. the MoE model."""
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    folder = Path(folder)
    dims = {**ERNIE_MTP_OVERRIDES, **overrides}
    hf_folder = make_tiny_checkpoint(arch, folder / "_hf", seed=seed, **dims)
    cfg = json.loads((hf_folder / "config.json").read_text())
    tensors = {k: v.astype(np.float32) for k, v in load_file(hf_folder / "model.safetensors").items()}
    head = tiny_mtp_tensors(cfg, mtp_seed)
    convert = to_paddle_names if layout == "paddle" else dict
    main = {**tensors, **head} if mtp == "inline" else tensors
    save_file(convert(main), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))
    write_tiny_tokenizer(folder)
    if mtp == "folder":
        (folder / "mtp").mkdir()
        (folder / "mtp" / "config.json").write_text(json.dumps(cfg))
        save_file(convert(head), str(folder / "mtp" / "model.safetensors"))
    for f in hf_folder.iterdir():
        f.unlink()
    hf_folder.rmdir()
    return folder


# --- EAGLE heads for a tiny Llama target: tests/spec_decode ---------------------------------------------
# vLLM's EagleLlamaForCausalLM layout (models/llama_eagle.py): config.json of a Llama with its own layer
# shapes (here unlike the target's, so the head's own config is what builds it), safetensors without a
# `model.` prefix, no input norm in layer 0, no final norm and no lm_head.
EAGLE_DIMS = dict(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=96)


def tiny_eagle_tensors(cfg: dict, seed: int = 5, embed: bool = False, fc_bias: bool = False) -> dict:
    """A random EAGLE head for the head config `cfg`: fc [H, 2H] (+ fc.bias), its layers (layer 0
    without input_layernorm), and with `embed` its own embed_tokens and lm_head. Linear weights
    [out, in], fp32."""
    rng = np.random.default_rng(seed)
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim

    def w(*shape, scale=0.15):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    out = {"fc.weight": w(hidden, 2 * hidden)}
    if fc_bias:
        out["fc.bias"] = w(hidden)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        if i > 0:
            out[p + "input_layernorm.weight"] = 1.0 + w(hidden, scale=0.2)
        out[p + "post_attention_layernorm.weight"] = 1.0 + w(hidden, scale=0.2)
        out[p + "self_attn.q_proj.weight"] = w(q, hidden)
        out[p + "self_attn.k_proj.weight"] = w(kv, hidden)
        out[p + "self_attn.v_proj.weight"] = w(kv, hidden)
        out[p + "self_attn.o_proj.weight"] = w(hidden, q)
        out[p + "mlp.gate_proj.weight"] = w(inter, hidden)
        out[p + "mlp.up_proj.weight"] = w(inter, hidden)
        out[p + "mlp.down_proj.weight"] = w(hidden, inter)
    if embed:
        out["embed_tokens.weight"] = w(cfg["vocab_size"], hidden, scale=1.0)
        out["lm_head.weight"] = w(cfg["vocab_size"], hidden)
    return out


def make_tiny_eagle(
    folder: str | Path,
    target: str | Path,
    seed: int = 5,
    embed: bool = False,
    fc_bias: bool = False,
    **overrides,
) -> Path:
    """An EAGLE head for the tiny checkpoint in `target` (hidden and vocab sizes as the target's, unless
    `overrides` change them), written in `folder`; returns the folder."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads((Path(target) / "config.json").read_text())
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": base["hidden_size"],
        "vocab_size": base["vocab_size"],
        "max_position_embeddings": base["max_position_embeddings"],
        "rms_norm_eps": base["rms_norm_eps"],
        "rope_theta": 50000.0,
        "hidden_act": "silu",
        **EAGLE_DIMS,
        **overrides,
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tiny_eagle_tensors(cfg, seed, embed, fc_bias), str(folder / "model.safetensors"))
    return folder


def make_tiny_eagle3(
    folder: str | Path,
    target: str | Path,
    seed: int = 8,
    draft_vocab_size: int = 200,
    embed: bool = False,
    d2t: bool = True,
    lm_head: bool = True,
    **overrides,
) -> Path:
    """An EAGLE-3 head for the tiny checkpoint in `target`, in vLLM's Eagle3LlamaForCausalLM layout as
    the yuhuili/EAGLE3-* heads name it: midlayer.* (q/k/v read 2H, a hidden_norm), fc [H, 3H], norm,
    lm_head over `draft_vocab_size` ids, d2t (int64 offsets: draft id d is target id d + d2t[d], a
    random sorted subset; without `d2t` the first ids) and t2d; without `lm_head` none (the target's
    is used). `overrides`: config keys
    (eagle_aux_hidden_state_layer_ids, norm_before_residual, ...)."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads((Path(target) / "config.json").read_text())
    hidden, vocab = base["hidden_size"], base["vocab_size"]
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab_size,
        "max_position_embeddings": base["max_position_embeddings"],
        "rms_norm_eps": base["rms_norm_eps"],
        "rope_theta": 50000.0,
        "hidden_act": "silu",
        **EAGLE_DIMS,
        **overrides,
    }
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.15):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    head_dim = hidden // cfg["num_attention_heads"]
    q, kv, inter = (
        cfg["num_attention_heads"] * head_dim,
        cfg["num_key_value_heads"] * head_dim,
        cfg["intermediate_size"],
    )
    m = "midlayer."
    tensors = {
        "fc.weight": w(hidden, 3 * hidden),
        "norm.weight": 1.0 + w(hidden, scale=0.2),
        m + "hidden_norm.weight": 1.0 + w(hidden, scale=0.2),
        m + "input_layernorm.weight": 1.0 + w(hidden, scale=0.2),
        m + "post_attention_layernorm.weight": 1.0 + w(hidden, scale=0.2),
        m + "self_attn.q_proj.weight": w(q, 2 * hidden),
        m + "self_attn.k_proj.weight": w(kv, 2 * hidden),
        m + "self_attn.v_proj.weight": w(kv, 2 * hidden),
        m + "self_attn.o_proj.weight": w(hidden, q),
        m + "mlp.gate_proj.weight": w(inter, hidden),
        m + "mlp.up_proj.weight": w(inter, hidden),
        m + "mlp.down_proj.weight": w(hidden, inter),
    }
    for i in range(1, cfg["num_hidden_layers"]):  # further layers: plain Llama layers, named layers.N
        p = f"layers.{i}."
        tensors[p + "input_layernorm.weight"] = 1.0 + w(hidden, scale=0.2)
        tensors[p + "post_attention_layernorm.weight"] = 1.0 + w(hidden, scale=0.2)
        for name, shape in (("q", (q, hidden)), ("k", (kv, hidden)), ("v", (kv, hidden)), ("o", (hidden, q))):
            tensors[p + f"self_attn.{name}_proj.weight"] = w(*shape)
        tensors[p + "mlp.gate_proj.weight"] = w(inter, hidden)
        tensors[p + "mlp.up_proj.weight"] = w(inter, hidden)
        tensors[p + "mlp.down_proj.weight"] = w(hidden, inter)
    if lm_head:
        tensors["lm_head.weight"] = w(draft_vocab_size, hidden)
    if d2t:
        ids = np.sort(rng.choice(vocab, draft_vocab_size, replace=False))
        tensors["d2t"] = (ids - np.arange(draft_vocab_size)).astype(np.int64)
        t2d = np.zeros(vocab, dtype=bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    if embed:
        tensors["embed_tokens.weight"] = w(vocab, hidden, scale=1.0)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
