"""What tensor-parallel rank 0 sends its workers (msgpack over ZMQ IPC; nothing is pickled).

Per step, rank 0 sends the model inputs it built from the SchedulerOutput (`ForwardStep`: the same
arrays its own forward takes), then for every LM-head call the hidden rows it computes logits of
(`LogitsStep`), so each worker runs the same collectives in the same order. Workers answer nothing:
the collectives inside the forward are the lockstep.
"""

from __future__ import annotations

from typing import Union

import msgspec
import numpy as np


class NDArray(msgspec.Struct, array_like=True):
    dtype: str
    shape: list[int]
    data: bytes

    @classmethod
    def of(cls, a: np.ndarray) -> NDArray:
        a = np.ascontiguousarray(a)
        return cls(a.dtype.str, list(a.shape), a.tobytes())

    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype)).reshape(self.shape)


class WorkerInit(msgspec.Struct, tag="init"):
    """Sent once, after rank 0 sized its KV cache: every rank holds the same number of blocks."""

    num_blocks: int


class ForwardStep(msgspec.Struct, tag="forward"):
    input_ids: NDArray
    positions: NDArray
    slot_mapping: NDArray
    query_start_loc: NDArray
    seq_lens: NDArray
    block_tables: NDArray
    prompt_rows: NDArray | None
    max_query_len: int
    max_seq_len: int
    block_size: int


class LogitsStep(msgspec.Struct, tag="logits"):
    hidden: NDArray


class StopWorker(msgspec.Struct, tag="stop"):
    pass


WorkerInput = Union[WorkerInit, ForwardStep, LogitsStep, StopWorker]
encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(WorkerInput)
