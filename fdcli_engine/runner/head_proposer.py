"""What the proposers whose head continues from the target's hidden states share: ERNIE's MTP layer
(mtp_proposer.py) and an EAGLE head (eagle_proposer.py). The head is a model with `forward(input_ids,
previous_hidden, positions, kv_caches, meta)` and `compute_logits(hidden)` (models/ernie4_5_mtp.py,
models/llama_eagle.py).

Rows of a step (model_proposer.py): the head's row at position j takes the token at j+1 and the target's
hidden state at j, so the rows [c, L) of a request need its tokens up to L: the step's own tokens and
what it produced, or, mid-prompt, the next prompt token (only a request the runner failed, which ends,
has neither: its row L-1 is left out). The last row's output is the first draft. Each further draft is
one row at the next position, fed the head's own previous output as its hidden state (FastDeploy's MTP
substeps; vLLM's EAGLE loop).

A prefix-cache hit may reuse a block whose last row took the next token of the request that filled it,
not this one's: only the quality of this request's drafts can differ (verification is exact).
"""

from __future__ import annotations

from fdcli_engine.runner.model_proposer import ModelProposer, RequestStep, Rows, gather_rows


def head_quantization(config) -> str | None:
    """The head's weights: `quantization` of the speculative config, else the target's (wint8 / wint4);
    GGUF blocks and "as stored" mean fp32 (a head is stored as safetensors)."""
    q = config.speculative_config.quantization or config.quantization
    return None if q in ("gguf", "none", "auto") else q


def hidden_rows(rows: list[Rows]) -> list[int]:
    """The target's row feeding each row of the first forward, in order."""
    return [i for r in rows for i in r.hidden_rows]


class HeadProposer(ModelProposer):
    feeds_hidden = True

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
        feeding = list(range(rs.first_row, rs.first_row + len(tokens)))
        return Rows(tokens, c, rs.sr.block_ids, rs.sr.prompt_token_ids, feeding, num_drafts)

    def first_hidden(self, step, rows):
        return gather_rows(step.hidden, hidden_rows(rows))

    def forward(self, inputs, hidden_in):
        return self.model.forward(inputs.input_ids, hidden_in, inputs.positions, self.kv_caches, inputs.meta)
