"""Flattens a SchedulerOutput into model inputs: token ids, positions, slot mapping, block tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import paddle

from fdcli_engine.step_types import AttentionMetadata, ScheduledRequest


@dataclass
class ModelInputs:
    input_ids: paddle.Tensor
    positions: paddle.Tensor
    meta: AttentionMetadata
    # Row of the last scheduled token of each request, in `scheduled` order.
    last_token_rows: np.ndarray


_CPU = paddle.CPUPlace()


def _tensor(a: np.ndarray) -> paddle.Tensor:
    # A copy, as paddle.to_tensor makes, without its argument handling (which costs more than the copy
    # at these sizes; six calls a step).
    return paddle.Tensor(a, _CPU)


def prompt_rows_tensor(mask: np.ndarray, multi_row_decode: bool = False) -> paddle.Tensor | None:
    """AttentionMetadata.prompt_rows from a bool [T] mask of the rows holding prompt tokens. None (no
    prompt row) only for a step of one-row decodes: paged attention reads a missing mask as "every row
    a prompt row", so a step verifying drafts (generated rows after each other, `multi_row_decode`)
    keeps its all-zero mask and each of its queries is decoded alone."""
    return _tensor(mask.astype(np.uint8)) if mask.any() or multi_row_decode else None


def build_inputs(
    scheduled: list[ScheduledRequest], block_size: int, mark_prompt_rows: bool = False
) -> ModelInputs:
    """The step's model inputs. `mark_prompt_rows` fills meta.prompt_rows (the generation runner: bf16
    prompt rows on AMX CPUs); without it every row is computed on its usual path (the pooling runner)."""
    n = len(scheduled)
    q_lens = np.fromiter((len(s.token_ids) for s in scheduled), dtype=np.int32, count=n)
    starts = np.fromiter((s.num_computed_tokens for s in scheduled), dtype=np.int32, count=n)
    query_start_loc = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(q_lens, out=query_start_loc[1:])
    seq_lens = starts + q_lens
    total = int(query_start_loc[-1])

    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    max_blocks = max(len(s.block_ids) for s in scheduled)
    block_tables = np.zeros((n, max_blocks), dtype=np.int32)
    for i, s in enumerate(scheduled):
        a, b = query_start_loc[i], query_start_loc[i + 1]
        input_ids[a:b] = s.token_ids
        positions[a:b] = np.arange(starts[i], seq_lens[i])
        block_tables[i, : len(s.block_ids)] = s.block_ids
    seq_idx = np.repeat(np.arange(n), q_lens)
    prompt_lens = np.fromiter((len(s.prompt_token_ids) for s in scheduled), dtype=np.int64, count=n)
    slot_mapping = (
        block_tables[seq_idx, positions // block_size].astype(np.int64) * block_size + positions % block_size
    )

    meta = AttentionMetadata(
        slot_mapping=_tensor(slot_mapping),
        query_start_loc=_tensor(query_start_loc),
        seq_lens=_tensor(seq_lens),
        block_tables=_tensor(block_tables),
        max_query_len=int(q_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        query_start_loc_np=query_start_loc,
        seq_lens_np=seq_lens,
        prompt_rows=(
            prompt_rows_tensor(positions < prompt_lens[seq_idx], int(q_lens.max()) > 1)
            if mark_prompt_rows
            else None
        ),
    )
    return ModelInputs(
        input_ids=_tensor(input_ids),
        positions=_tensor(positions),
        meta=meta,
        last_token_rows=query_start_loc[1:] - 1,
    )
