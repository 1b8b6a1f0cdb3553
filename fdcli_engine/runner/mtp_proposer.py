"""`"method": "mtp"`: ERNIE-4.5's multi-token-prediction head drafts (models/ernie4_5_mtp.py).

The head is read from `spec.model` (a separate MTP folder, FastDeploy's "model" key) or else from the
target's own checkpoint (Paddle or HF naming); quantized as `spec.quantization`, else as the target.
Refused at start, in one line: a target that is not ERNIE-4.5, and a checkpoint without the head.

Rows of a step (model_proposer.py): the head's row at position j takes the token at j+1 and the target's
hidden state at j, so the rows [c, L) of a request need its tokens up to L: the step's own tokens and
what it produced, or, mid-prompt, the next prompt token (only a request the runner failed, which ends,
has neither: its row L-1 is left out). The last row's output is the first draft. Each further draft is one row at the next position, fed the head's own previous output as
its hidden state (FastDeploy's substeps).

A prefix-cache hit may reuse a block whose last row took the next token of the request that filled it,
not this one's: only the quality of this request's drafts can differ (verification is exact).
"""

from __future__ import annotations

from fdcli_engine.errors import ConfigError, ModelLoadError
from fdcli_engine.models.ernie4_5 import Ernie4_5ForCausalLM
from fdcli_engine.models.ernie4_5_mtp import Ernie4_5_MTP
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.runner.model_proposer import ModelProposer, RequestStep, Rows, gather_rows


def load_mtp_head(config: ResolvedConfig, target_model) -> Ernie4_5_MTP:
    from fdcli_engine.loader import iter_mtp_weights  # noqa: PLC0415

    if not isinstance(target_model, Ernie4_5ForCausalLM):
        arch = (config.hf_config.get("architectures") or [type(target_model).__name__])[0]
        raise ConfigError(
            f"--speculative-config: method mtp drafts with ERNIE-4.5's multi-token-prediction layer, which "
            f"{arch} does not have: use ngram (or draft_model with a smaller model of the same vocabulary)"
        )
    spec = config.speculative_config
    source = spec.model or config.model_path
    quantization = spec.quantization or config.quantization
    if quantization in ("gguf", "none", "auto"):
        quantization = None
    head = Ernie4_5_MTP(target_model, quantization)
    try:
        head.load_weights(iter_mtp_weights(source), str(source))
    except ModelLoadError as exc:
        hint = "" if spec.model else ' (a separate MTP folder goes in "model")'
        raise ConfigError(f"--speculative-config: method mtp: {exc}{hint}") from None
    return head


class MTPProposer(ModelProposer):
    feeds_hidden = True

    def __init__(self, config: ResolvedConfig, target_model):
        super().__init__(config, load_mtp_head(config, target_model))

    def rows_for(self, rs: RequestStep, wants: int) -> Rows | None:
        c, cached = rs.sr.num_computed_tokens, rs.num_cached
        tokens = rs.tokens[1:]  # positions c+1 .. : the next token of each row
        if len(tokens) < cached - c:
            nxt = rs.token_at(cached)
            if nxt is not None:
                tokens = [*tokens, nxt]
        tokens = tokens[: cached - c]
        if not tokens:
            return None
        num_drafts = min(wants, rs.limit - cached + 1) if rs.produced else 0
        hidden_rows = list(range(rs.first_row, rs.first_row + len(tokens)))
        return Rows(tokens, c, rs.sr.block_ids, rs.sr.prompt_token_ids, hidden_rows, num_drafts)

    def first_hidden(self, step, rows):
        return gather_rows(step.hidden, [i for r in rows for i in r.hidden_rows])

    def forward(self, inputs, hidden_in):
        return self.model.forward(inputs.input_ids, hidden_in, inputs.positions, self.kv_caches, inputs.meta)
