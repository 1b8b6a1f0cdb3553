"""`"method": "draft_model"`: a smaller model with the target's vocabulary drafts greedily.

The draft is loaded by the target's loader from `spec.model` (any layout and architecture fd loads),
quantized as `spec.quantization` says, else as the target is (a GGUF draft keeps its blocks when the
target does not ask for wint8/wint4). Its KV cache lives in the target's block pool (model_proposer.py).
The target named as its own draft (same file, same quantization) shares the target's weights.

Rows of a step: [c, L) keep its cache level with the target's; a drafting request adds the row at L (the
token the target just produced), whose output is the first draft, then one row per further draft.
Refused at start, in one line: a draft whose vocabulary (vocab_size, or the bos/eos ids its config
names) differs from the target's, or whose context is shorter than max_model_len.
"""

from __future__ import annotations

from fdcli_engine.config import resolve_model_path
from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.model_proposer import ModelProposer, RequestStep, Rows
from fdcli_engine.speculative_config import check_quantization


def draft_quantization(spec_quantization: str | None, target_quantization: str | None, is_gguf: bool):
    """The draft's resolved quantization (None: weights as stored, dequantized to fp32)."""
    q = spec_quantization
    if q is None:
        # Inherit wint8/wint4; "as stored" (or the target's GGUF blocks) means the draft's own storage.
        q = target_quantization if target_quantization in ("wint8", "wint4") else "auto"
    check_quantization(q)
    if q == "auto":
        return "gguf" if is_gguf else None
    if q == "gguf" and not is_gguf:
        raise ConfigError('--speculative-config: quantization "gguf" needs a .gguf draft model')
    return None if q == "none" else q


def resolve_draft_config(config: ResolvedConfig) -> ResolvedConfig:
    """The target's ResolvedConfig with the draft's model, layout, config and quantization."""
    from fdcli_engine.loader import detect_layout, read_model_config  # noqa: PLC0415

    spec = config.speculative_config
    try:
        path = resolve_model_path(spec.model)
    except ConfigError as exc:
        raise ConfigError(f"--speculative-config: draft {exc}") from None
    try:
        layout, path = detect_layout(path)
        hf_config = read_model_config(path)
    except ModelLoadError as exc:
        raise ConfigError(f"--speculative-config: draft model: {exc}") from None
    quantization = draft_quantization(spec.quantization, config.quantization, layout == "gguf")
    return config.replace(
        model=spec.model,
        model_path=path,
        layout=layout,
        hf_config=hf_config,
        quantization=quantization,
        speculative_config=None,
    )


def check_same_vocabulary(draft_config: ResolvedConfig, target_config: ResolvedConfig, target_model):
    draft, target = draft_config.hf_config, target_config.hf_config
    name = draft_config.model
    if int(draft["vocab_size"]) != target_model.vocab_size:
        raise ConfigError(
            f"--speculative-config: the draft model {name} has a vocabulary of {draft['vocab_size']} tokens, "
            f"the target {target_model.vocab_size}: a draft model must share the target's tokenizer"
        )
    for key in ("bos_token_id", "eos_token_id"):
        a, b = draft.get(key), target.get(key)
        if a is not None and b is not None and a != b:
            raise ConfigError(
                f"--speculative-config: the draft model {name} has {key} {a}, the target {b}: a draft "
                "model must share the target's tokenizer"
            )
    context = draft.get("max_position_embeddings")
    if context and int(context) < target_config.max_model_len:
        raise ConfigError(
            f"--speculative-config: the draft model {name} handles {context} positions, fewer than "
            f"--max-model-len {target_config.max_model_len}: lower --max-model-len"
        )


def is_same_model(draft_config: ResolvedConfig, config: ResolvedConfig) -> bool:
    same_path = (
        config.model_path is not None and draft_config.model_path.resolve() == config.model_path.resolve()
    )
    return same_path and draft_config.quantization == config.quantization


class DraftModelProposer(ModelProposer):
    def __init__(self, config: ResolvedConfig, target_model):
        from fdcli_engine.loader import load_model  # noqa: PLC0415

        draft_config = resolve_draft_config(config)
        check_same_vocabulary(draft_config, config, target_model)
        if is_same_model(draft_config, config):
            # The target as its own draft: its weights serve both (forwards never overlap), not its cache.
            super().__init__(config, target_model)
            return
        try:
            model = load_model(draft_config)
        except ModelLoadError as exc:
            raise ConfigError(f"--speculative-config: draft model: {exc}") from None
        super().__init__(config, model)

    def rows_for(self, rs: RequestStep, wants: int) -> Rows | None:
        c, cached = rs.sr.num_computed_tokens, rs.num_cached
        drafting = wants > 0 and cached < rs.limit
        n = cached - c + (1 if drafting else 0)
        num_drafts = min(wants, rs.limit - cached) if drafting else 0
        return Rows(rs.tokens[:n], c, rs.sr.block_ids, rs.sr.prompt_token_ids, num_drafts=num_drafts)

    def forward(self, inputs, hidden_in):
        return self.model.forward(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
