"""Flattens a SchedulerOutput into model inputs: token ids, positions, slot mapping, block tables.

The runner passes an `InputBuffers` of its own: each step's tensors are then host tensors made once and
refilled in place (a write into a numpy view of each) rather than new ones every step, which costs more
than computing them at decode sizes. The arrays are computed afresh every step from the step alone, so
nothing stale can reach a tensor: only the memory is reused. A decode step (one generated row per
request) skips the intermediate arrays: its values go from the requests straight into buffers of its own
(`InputBuffers.one_row_inputs`), and a block-table row is rewritten only when its request's blocks differ
from the ones it holds. Callers without buffers (proposers, the pooling runner, tests) get new tensors."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

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


def host_tensor(a: np.ndarray) -> paddle.Tensor:
    # A copy, as paddle.to_tensor makes, without its argument handling (which costs more than the copy
    # at these sizes).
    return paddle.Tensor(a, _CPU)


class InputBuffers:
    """Host tensors reused across steps, one per (input name, shape, dtype).

    Invariant: a tensor that `stage` returns holds the staged values until the next `stage` of the same
    name and shape; the runner's uses of a step's inputs (forward, LM head, proposer, tensor-parallel
    send) all end within that step's execute, before the next step stages. The host copies in
    AttentionMetadata (`*_np`) are never these buffers' memory."""

    MAX_ENTRIES = 64  # shapes change with the batch; past this many, start over

    def __init__(self):
        self._entries: dict[tuple, tuple[paddle.Tensor, np.ndarray]] = {}
        self._decode: dict[int, _DecodeBuffers] = {}  # decode steps' own buffers, by batch size

    def one_row_inputs(self, scheduled: list[ScheduledRequest], block_size: int) -> ModelInputs | None:
        """A decode step's inputs (one generated row per request, no prompt row) written straight into
        this batch size's buffers from the requests: the values `build_inputs` computes, without the
        intermediate arrays. None for any other step. A block-table row is rewritten only when its
        request's block list differs from the one it holds (compared by value every step)."""
        n = len(scheduled)
        pos, slots, ids, tables = [], [], [], []
        for s in scheduled:
            p = s.num_computed_tokens
            if len(s.token_ids) != 1 or p < len(s.prompt_token_ids):
                return None
            pos.append(p)
            slots.append(_slot(s.block_ids, p, block_size))
            ids.append(s.token_ids[0])
            tables.append(s.block_ids)
        d = self._decode.get(n)
        if d is None:
            if len(self._decode) >= self.MAX_ENTRIES:
                self._decode.clear()
            d = self._decode[n] = _DecodeBuffers(n)
        # The host copy, never the buffers' memory; +1 on the list (a numpy in-place add costs more).
        seq_lens = np.array([p + 1 for p in pos], dtype=np.int32)
        if n == 1:  # scalar stores: a list store converts the list to an array first
            d.ids[0], d.positions[0], d.slots[0], d.seq_lens[0] = ids[0], pos[0], slots[0], pos[0] + 1
        else:
            d.ids[...] = ids
            d.positions[...] = pos
            d.slots[...] = slots
            d.seq_lens[...] = seq_lens
        meta = AttentionMetadata(
            slot_mapping=d.tensors[2],
            query_start_loc=d.tensors[3],
            seq_lens=d.tensors[4],
            block_tables=d.block_tables(tables),
            max_query_len=1,
            max_seq_len=max(pos) + 1,
            block_size=block_size,
            query_start_loc_np=d.query_start_loc,
            seq_lens_np=seq_lens,
        )
        return ModelInputs(d.tensors[0], d.tensors[1], meta, d.last_token_rows)

    def stage(self, name: str, a: np.ndarray) -> paddle.Tensor:
        """A tensor holding `a`'s values: the buffer for (name, shape, dtype), refilled."""
        key = (name, a.shape, a.dtype.char)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            t = host_tensor(a)
            self._entries[key] = (t, np.from_dlpack(t))
            return t
        entry[1][...] = a
        return entry[0]


def _slot(block_ids: list[int], position: int, block_size: int) -> int:
    """The KV cache slot of a request's token at `position` (slot_mapping's rule, one row at a time)."""
    return block_ids[position // block_size] * block_size + position % block_size


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class _DecodeBuffers:
    """The tensors of decode steps of `n` requests (InputBuffers.one_row_inputs) and numpy views of them;
    the row starts and last rows of such a step never change, so they are made once, read-only."""

    def __init__(self, n: int):
        arrays = [np.zeros(n, np.int64)] * 3 + [np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32)]
        # input_ids, positions, slot_mapping, starts, seq_lens
        self.tensors = [host_tensor(a) for a in arrays]
        self.ids, self.positions, self.slots, _, self.seq_lens = (np.from_dlpack(t) for t in self.tensors)
        self.query_start_loc = _read_only(np.arange(n + 1, dtype=np.int32))
        self.last_token_rows = _read_only(np.arange(n, dtype=np.int32))
        self._tables: dict[int, tuple[paddle.Tensor, np.ndarray, list[list[int]]]] = {}  # by width

    def block_tables(self, lists: list[list[int]]) -> paddle.Tensor:
        """The [n, width] table tensor holding `lists` (unused entries 0)."""
        width = max(map(len, lists))
        entry = self._tables.get(width)
        if entry is None:
            t = host_tensor(np.zeros((len(lists), width), np.int32))
            entry = self._tables[width] = (t, np.from_dlpack(t), [[] for _ in lists])
        t, table, held = entry
        for row, (ids, old) in enumerate(zip(lists, held)):
            if ids != old:
                table[row, : len(ids)] = ids
                table[row, len(ids) :] = 0
                held[row] = list(ids)
        return t


def fresh_tensor(name: str, a: np.ndarray) -> paddle.Tensor:
    return host_tensor(a)


def prompt_rows_tensor(
    mask: np.ndarray, multi_row_decode: bool = False, stage=fresh_tensor
) -> paddle.Tensor | None:
    """AttentionMetadata.prompt_rows from a bool [T] mask of the rows holding prompt tokens. None (no
    prompt row) only for a step of one-row decodes: paged attention reads a missing mask as "every row
    a prompt row", so a step verifying drafts (generated rows after each other, `multi_row_decode`)
    keeps its all-zero mask and each of its queries is decoded alone."""
    return stage("prompt_rows", mask.astype(np.uint8)) if mask.any() or multi_row_decode else None


def _block_tables(scheduled: list[ScheduledRequest]) -> np.ndarray:
    """int32 [n, max_blocks], unused entries 0."""
    lists = [s.block_ids for s in scheduled]
    lens = [len(b) for b in lists]
    width = max(lens)
    if min(lens) == width:
        return np.array(lists, dtype=np.int32).reshape(len(lists), width)
    table = np.zeros((len(lists), width), dtype=np.int32)
    for row, ids in zip(table, lists):
        row[: len(ids)] = ids
    return table


@dataclass
class _StepArrays:
    """A step's inputs as host arrays, before they become tensors."""

    input_ids: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    slot_mapping: np.ndarray  # int64 [T]
    query_start_loc: np.ndarray  # int32 [B+1]
    seq_lens: np.ndarray  # int32 [B]
    block_tables: np.ndarray  # int32 [B, max_blocks]
    max_query_len: int
    prompt_mask: np.ndarray | None  # bool [T]: the rows holding prompt tokens; None: none does


def _varlen_arrays(scheduled: list[ScheduledRequest], block_size: int) -> _StepArrays:
    """Any step: each request's rows one after another."""
    n = len(scheduled)
    tokens = [s.token_ids for s in scheduled]
    q_lens = np.array([len(t) for t in tokens], dtype=np.int32)
    starts = np.array([s.num_computed_tokens for s in scheduled], dtype=np.int32)
    query_start_loc = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(q_lens, out=query_start_loc[1:])
    total = int(query_start_loc[-1])
    input_ids = np.fromiter(chain.from_iterable(tokens), dtype=np.int64, count=total)
    seq_idx = np.repeat(np.arange(n), q_lens)
    positions = np.arange(total, dtype=np.int64) + (starts - query_start_loc[:-1])[seq_idx]
    block_tables = _block_tables(scheduled)
    slot_mapping = (
        block_tables[seq_idx, positions // block_size].astype(np.int64) * block_size + positions % block_size
    )
    prompt_lens = np.array([len(s.prompt_token_ids) for s in scheduled], dtype=np.int64)
    return _StepArrays(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=starts + q_lens,
        block_tables=block_tables,
        max_query_len=int(q_lens.max()),
        prompt_mask=positions < prompt_lens[seq_idx],
    )


def _one_seq_arrays(s: ScheduledRequest, block_size: int) -> _StepArrays:
    """A step of one request (a prompt or a chunk of one, or one request's draft rows): its rows
    are consecutive positions, computed without the per-sequence index arrays. The same arrays as
    `_varlen_arrays` gives for such a step."""
    start, n = s.num_computed_tokens, len(s.token_ids)
    positions = np.arange(start, start + n, dtype=np.int64)
    table = np.array(s.block_ids, dtype=np.int32)
    return _StepArrays(
        input_ids=np.array(s.token_ids, dtype=np.int64),
        positions=positions,
        slot_mapping=table[positions // block_size].astype(np.int64) * block_size + positions % block_size,
        query_start_loc=np.array([0, n], dtype=np.int32),
        seq_lens=np.array([start + n], dtype=np.int32),
        block_tables=table.reshape(1, len(table)),
        max_query_len=n,
        prompt_mask=positions < len(s.prompt_token_ids),
    )


def _one_row_arrays(scheduled: list[ScheduledRequest], block_size: int) -> _StepArrays:
    """A step of one row per request (decode): row i is request i, computed on Python lists (fewer numpy
    calls: what a step costs in between two forwards, on cold caches, is mostly their count). The same
    arrays as `_varlen_arrays` gives for such a step."""
    pos = [s.num_computed_tokens for s in scheduled]
    slots = [_slot(s.block_ids, p, block_size) for s, p in zip(scheduled, pos)]
    in_prompt = [p < len(s.prompt_token_ids) for s, p in zip(scheduled, pos)]
    query_start_loc = np.arange(len(scheduled) + 1, dtype=np.int32)
    return _StepArrays(
        input_ids=np.array([s.token_ids[0] for s in scheduled], dtype=np.int64),
        positions=np.array(pos, dtype=np.int64),
        slot_mapping=np.array(slots, dtype=np.int64),
        query_start_loc=query_start_loc,
        seq_lens=np.array(pos, dtype=np.int32) + 1,
        block_tables=_block_tables(scheduled),
        max_query_len=1,
        prompt_mask=np.array(in_prompt, dtype=bool) if any(in_prompt) else None,
    )


def build_inputs(
    scheduled: list[ScheduledRequest],
    block_size: int,
    mark_prompt_rows: bool = False,
    buffers: InputBuffers | None = None,
) -> ModelInputs:
    """The step's model inputs. `mark_prompt_rows` fills meta.prompt_rows (the generation runner: bf16
    prompt rows on AMX and AVX512-BF16 CPUs); without it every row is computed on its usual path (the
    pooling runner).
    `buffers`: the tensors are refilled buffers (InputBuffers), else new ones."""
    if buffers is not None and mark_prompt_rows:
        inputs = buffers.one_row_inputs(scheduled, block_size)
        if inputs is not None:
            return inputs
    stage = buffers.stage if buffers is not None else fresh_tensor
    if all(len(s.token_ids) == 1 for s in scheduled):
        a = _one_row_arrays(scheduled, block_size)
    elif len(scheduled) == 1:
        a = _one_seq_arrays(scheduled[0], block_size)
    else:
        a = _varlen_arrays(scheduled, block_size)
    prompt_rows = None
    if mark_prompt_rows and a.prompt_mask is not None:
        prompt_rows = prompt_rows_tensor(a.prompt_mask, a.max_query_len > 1, stage)
    meta = AttentionMetadata(
        slot_mapping=stage("slot_mapping", a.slot_mapping),
        query_start_loc=stage("query_start_loc", a.query_start_loc),
        seq_lens=stage("seq_lens", a.seq_lens),
        block_tables=stage("block_tables", a.block_tables),
        max_query_len=a.max_query_len,
        max_seq_len=int(a.seq_lens.max()),
        block_size=block_size,
        query_start_loc_np=a.query_start_loc,
        seq_lens_np=a.seq_lens,
        prompt_rows=prompt_rows,
    )
    return ModelInputs(
        input_ids=stage("input_ids", a.input_ids),
        positions=stage("positions", a.positions),
        meta=meta,
        last_token_rows=a.query_start_loc[1:] - 1,
    )
