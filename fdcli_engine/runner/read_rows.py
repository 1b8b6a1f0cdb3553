"""Which rows of a step's final hidden states are read, and the attention metadata of those rows alone.

Only the sampled rows (runner/spec_decode.py sampling_rows: the last row of each request that samples,
every decode and draft-verification row) are read, unless something reads every row: prompt logprobs,
or a proposer that continues from the target's hidden states (MTP, `feeds_hidden`). A step where the
read rows are every row, or any of those readers, reads all rows (None). A prompt chunk that samples
nothing (chunked prefill before the last chunk) has no read row.

A model honours the answer in its last layer (models/decoder.py decode_layers, the C++ stack alike):
every row's K/V is still written, the attention, o_proj, MLP and final norm run on the kept rows only,
and the model returns those rows.

Bit identity: a kept row gets the values the whole step gives it. Its linears and norms depend on that
row alone, and so does its attention (a marked prompt run is tiled in lanes whatever its length, each
generated row is a run of its own: kernels attn_impl.h), with one exception: kS8 / kU4 prompt rows move
from the bf16 microkernel to the bf16 tiles at `ops.prompt_tile_min_rows()` rows (different sums). So
when a prompt row is kept, the kept prompt rows number at least min(that, all the step's prompt rows),
extra rows taken from the sequences' ends backwards. Each sequence's kept rows are a suffix of its rows,
so attention still places query i at context position seq_len - nq + i. The reference kernels (whose
matmuls may split by row count) always compute every row.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fdcli_engine import ops
from fdcli_engine.runner.input_batch import fresh_tensor
from fdcli_engine.step_types import AttentionMetadata, ScheduledRequest


def rows_read(scheduled: list[ScheduledRequest], sample_rows: np.ndarray, proposer) -> np.ndarray | None:
    """The step's rows whose hidden state is read: the sampling rows, or None (every row) when prompt
    logprobs or the proposer read them all, or the kernels cannot compute a subset bit-identically."""
    if ops.prompt_tile_min_rows is None:
        return None
    if any(s.needs_prompt_logprobs for s in scheduled):
        return None
    if getattr(proposer, "feeds_hidden", False):
        return None
    return np.unique(np.asarray(sample_rows, dtype=np.int64))


def kept_rows(qsl: np.ndarray, prompt_mask: np.ndarray, read: np.ndarray, min_prompt_rows: int) -> np.ndarray:
    """The rows to compute: each sequence's rows from its first read row on, then, when a prompt row is
    among them, earlier rows (last sequence first) until min(min_prompt_rows, all prompt rows) prompt
    rows are kept."""
    nseq = len(qsl) - 1
    start = np.asarray(qsl[1:], dtype=np.int64).copy()  # first kept row of each sequence (its end: none)
    for b, r in zip(np.searchsorted(qsl, read, side="right") - 1, read):
        start[b] = min(start[b], r)
    kept_prompt = sum(int(prompt_mask[start[b] : qsl[b + 1]].sum()) for b in range(nseq))
    need = min(min_prompt_rows, int(prompt_mask.sum())) - kept_prompt if kept_prompt else 0
    for b in range(nseq - 1, -1, -1):
        while need > 0 and start[b] > qsl[b]:
            start[b] -= 1
            need -= int(prompt_mask[start[b]])
    return np.concatenate([np.arange(start[b], qsl[b + 1], dtype=np.int64) for b in range(nseq)])


def step_metadata(
    meta: AttentionMetadata,
    scheduled: list[ScheduledRequest],
    sample_rows: np.ndarray,
    proposer,
    stage=fresh_tensor,
) -> AttentionMetadata:
    """The step's metadata for the model: `meta`, with `out` where rows go unread. A step without prompt
    rows (one-row decodes) samples every row, so it returns before any per-row work: this runs on every
    decode step. `stage`: how `out`'s tensors are made (the runner's InputBuffers.stage: refilled)."""
    if meta.prompt_rows is None:
        return meta
    return out_metadata(meta, rows_read(scheduled, sample_rows, proposer), stage)


def out_metadata(meta: AttentionMetadata, read: np.ndarray | None, stage=fresh_tensor) -> AttentionMetadata:
    """`meta`, with `out` set to the metadata of the rows to compute when they are not every row."""
    qsl = meta.query_start_loc_np.astype(np.int64)
    total = int(qsl[-1])
    if read is None or len(read) == total or meta.prompt_rows is None:
        return meta  # (no mask: attention tiles each sequence's queries by count, a subset would differ)
    mask = meta.prompt_rows.numpy().astype(bool)
    kept = kept_rows(qsl, mask, read, ops.prompt_tile_min_rows())
    if len(kept) == total:
        return meta
    counts = np.diff(np.searchsorted(kept, qsl))  # kept rows per sequence
    seqs = np.flatnonzero(counts)
    out_qsl = np.concatenate([[0], np.cumsum(counts[seqs])]).astype(np.int32)
    seq_lens = meta.seq_lens_np[seqs].astype(np.int32)
    tables = meta.block_tables.numpy()[seqs]
    rows = stage("out_rows", kept)  # host tensors, as the step's own inputs (runner/input_batch.py)
    out = AttentionMetadata(
        slot_mapping=stage("out_slot_mapping", meta.slot_mapping.numpy()[kept]),
        query_start_loc=stage("out_query_start_loc", out_qsl),
        seq_lens=stage("out_seq_lens", seq_lens),
        block_tables=stage("out_block_tables", tables),
        max_query_len=int(counts.max()),
        max_seq_len=int(seq_lens.max()) if len(seqs) else 0,
        block_size=meta.block_size,
        query_start_loc_np=out_qsl,
        seq_lens_np=seq_lens,
        prompt_rows=stage("out_prompt_rows", mask[kept].astype(np.uint8)),
        rows=rows,
    )
    return replace(meta, out=out)
