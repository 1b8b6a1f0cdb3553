"""Tiny random pooling checkpoints and their transformers references.

- "qwen3_embed": Qwen3ForCausalLM (is_matryoshka in config.json) to serve with --convert embed.
- "qwen3_seqcls": Qwen3ForSequenceClassification, 3 labels.
- "qwen2_prm": Qwen2ForProcessRewardModel (no transformers class: a Qwen2Model body saved under
  `model.` plus a score MLP score.0 / score.2 with 2 labels, the Qwen2.5-Math-PRM layout).
- "qwen2_rm": Qwen2ForRewardModel, same layout with 1 label.
- "bert_cross_encoder": BertForSequenceClassification with 1 label (a cross-encoder reranker), with
  all-MiniLM-L6-v2's WordPiece tokenizer (its pair template: [CLS] a [SEP] b [SEP], token types).
- "qwen3_reranker": Qwen3ForSequenceClassification with 1 label (a decoder cross-encoder).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import tiny_models

STEP_TAG = "<|im_end|>"  # a special token of the tiny tokenizer, used as the PRM step tag


def _randomize(model, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    tiny_models.randomize_weights(model)


def _config(family: str, **extra):
    import transformers

    dims = dict(tiny_models.TINY_DIMS)
    if family == "Qwen3":
        dims["head_dim"] = 32
    cfg = getattr(transformers, f"{family}Config")(**dims, **extra)
    cfg.rope_parameters = {"rope_theta": 10000.0, "rope_type": "default"}
    return cfg


def qwen3_embed(folder: Path) -> Path:
    tiny_models.make_tiny_checkpoint("Qwen3ForCausalLM", folder, seed=3)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["is_matryoshka"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    tiny_models.write_tiny_tokenizer(folder)
    return folder


def qwen3_seqcls(folder: Path) -> Path:
    import transformers

    cfg = _config("Qwen3", num_labels=3, pad_token_id=0)
    model = transformers.Qwen3ForSequenceClassification(cfg).eval()
    _randomize(model, 4)
    model.save_pretrained(folder)
    tiny_models.write_tiny_tokenizer(folder)
    return folder


def _score_model(folder: Path, arch: str, num_labels: int, seed: int) -> Path:
    import transformers
    from safetensors.torch import save_file

    cfg = _config("Qwen2")
    body = transformers.Qwen2Model(cfg).eval()
    _randomize(body, seed)
    tensors = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()}
    tensors.update(tiny_models.score_head_tensors(cfg.hidden_size, num_labels, seed))
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = cfg.to_dict()
    config.update(architectures=[arch], num_labels=num_labels)
    config.pop("id2label", None)
    config.pop("label2id", None)
    (folder / "config.json").write_text(json.dumps(config))
    tiny_models.write_tiny_tokenizer(folder)
    return folder


def qwen2_prm(folder: Path) -> Path:
    return _score_model(folder, "Qwen2ForProcessRewardModel", 2, 5)


def qwen2_rm(folder: Path) -> Path:
    return _score_model(folder, "Qwen2ForRewardModel", 1, 6)


def bert_cross_encoder(folder: Path) -> Path:
    import shutil

    import torch
    import transformers

    from fdcli_engine.config import default_embedding_model_path

    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        type_vocab_size=2,
        num_labels=1,
    )
    model = transformers.BertForSequenceClassification(cfg).eval()
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:  # large enough that scores spread over (0, 1) instead of sitting at 0.5
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(folder)
    src = default_embedding_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)
    return folder


def qwen3_reranker(folder: Path) -> Path:
    import transformers

    cfg = _config("Qwen3", num_labels=1, pad_token_id=0)
    model = transformers.Qwen3ForSequenceClassification(cfg).eval()
    _randomize(model, 8)
    model.save_pretrained(folder)
    tiny_models.write_tiny_tokenizer(folder)
    return folder


def reference_cross_scores(
    folder: Path, pairs: list[tuple[str, str]], max_length: int | None = None
) -> np.ndarray:
    """transformers' cross-encoder scores: tokenizer(a, b) (its pair template), the classification
    model, sigmoid of the one logit (sentence-transformers' CrossEncoder default for one label)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    kw = (
        {"attn_implementation": "eager"}
        if "Qwen" in transformers.AutoConfig.from_pretrained(folder).architectures[0]
        else {}
    )
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, **kw).eval()
    out = []
    for a, b in pairs:  # one by one: no padding in the reference
        cut = {"truncation": True, "max_length": max_length} if max_length else {}
        enc = tok(a, b, return_tensors="pt", **cut)
        with torch.no_grad():
            out.append(torch.sigmoid(model(**enc).logits[0, 0].double()).item())
    return np.array(out)


BUILDERS = {
    "qwen3_embed": qwen3_embed,
    "qwen3_seqcls": qwen3_seqcls,
    "qwen2_prm": qwen2_prm,
    "qwen2_rm": qwen2_rm,
    "bert_cross_encoder": bert_cross_encoder,
    "qwen3_reranker": qwen3_reranker,
}


def reference_hidden(folder: Path, ids: list[int]) -> np.ndarray:
    """transformers' last hidden state [L, hidden] of the base model (final norm applied)."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder)
    if cfg.architectures[0].endswith("ForCausalLM"):
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        body = model.model
    else:
        body = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return body(torch.tensor([ids])).last_hidden_state[0].numpy()


def reference_score_head(folder: Path, hidden: np.ndarray) -> np.ndarray:
    """The score MLP of a reward checkpoint (score.0 → ReLU → score.2) in float64 numpy."""
    from safetensors.numpy import load_file

    w = load_file(str(folder / "model.safetensors"))
    h = hidden.astype(np.float64) @ w["score.0.weight"].T + w["score.0.bias"]
    return np.maximum(h, 0) @ w["score.2.weight"].T + w["score.2.bias"]


def st_reference(texts: list[str]) -> np.ndarray:
    """sentence-transformers' all-MiniLM-L6-v2 pipeline, computed with transformers directly."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from fdcli_engine.config import default_embedding_model_path

    path = default_embedding_model_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    out = []
    for t in texts:  # one by one: no padding anywhere in the reference
        batch = tok([t], truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            h = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        out.append(torch.nn.functional.normalize((h * mask).sum(1) / mask.sum(1), dim=-1)[0].numpy())
    return np.stack(out)


def pool_images(folder, prompt: str, images: list, **options) -> tuple[list[list[int]], list[np.ndarray]]:
    """Each of `images` with `prompt` (its one image placeholder run) as a pooling request through the
    in-process EngineCore: (expanded ids, raw pooled output) per request; no image state left over."""
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config
    from fdcli_engine.engine import EngineCore, EngineCoreRequest
    from fdcli_engine.multimodal.processor import get_image_processor
    from fdcli_engine.pooling_params import PoolingParams
    from fdcli_engine.tokenizer import load_tokenizer

    config = resolve_config(EngineConfig(model=str(folder), max_num_seqs=4, max_model_len=256, **options))
    core = EngineCore(config)
    proc = get_image_processor(config.hf_config, config.model_path)
    base = load_tokenizer(config).encode(prompt)
    ids = []
    for i, image in enumerate(images):
        p, feats = proc.process(base, [image])
        ids.append(p)
        core.add_request(EngineCoreRequest(f"r{i}", p, pooling_params=PoolingParams(), mm_features=feats))
    pooled = {}
    while core.has_unfinished_requests():
        for out in core.step():
            pooled[out.req_id] = np.asarray(out.pooled, dtype=np.float32)
    assert not core.runner.mm._states
    return ids, [pooled[f"r{i}"] for i in range(len(ids))]
