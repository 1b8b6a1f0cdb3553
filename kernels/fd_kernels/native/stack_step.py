"""The decoder stack's greedy step on token ids through ctypes (`fd_decoder_stack_greedy_host`, exported by
the same library as the ops, csrc/decoder_stack_op.cc): what the `fd_decoder_stack` op computes with
greedy tokens, bit for bit, without Paddle's custom-op dispatch on the way in and out of every decode step.

It applies to a step of token ids with no prompt-row mask and no out rows (one-row decodes, the runner's
all-greedy decode step), metadata in the engine's dtypes (int64 positions / slot_mapping, int32
query_start_loc / seq_lens / block_tables), and a plan holding the token table and the LM head. Anything
else, or a library without the symbol, answers None and the caller runs the op.

Outputs: the tokens go to a numpy buffer and the hidden states to a [T, hidden] tensor, both owned by the
stack and written again by its next step of T rows: the returned hidden tensor is valid until then, and
no caller may keep it (the runner reads it only within the step, for a NaN row's logits).
"""

from __future__ import annotations

import ctypes

import numpy as np
import paddle

from fd_kernels.build import library_path

_I64, _I32 = paddle.int64, paddle.int32
_P, _N = ctypes.c_void_p, ctypes.c_int64
_ERROR_SIZE = 1024

_entry = None  # the bound C function; False where the library lacks it
steps = 0  # steps taken through ctypes (tests check the path is taken)


def _bind():
    global _entry
    if _entry is None:
        try:
            fn = ctypes.CDLL(library_path()).fd_decoder_stack_greedy_host
        except (AttributeError, OSError):  # another build of the library: the op alone
            _entry = False
            return _entry
        fn.restype = ctypes.c_int32
        fn.argtypes = [_P, _N, _P, _N, _P, _P, _P, _N, _P, _P, _N, _P, _N, _P, _P, ctypes.c_char_p, _N]
        _entry = fn
    return _entry


class StepBuffers:
    """One stack's ctypes step state: the outputs per row count, and the argument list of the last step's
    tensors (the runner passes the same persistent tensors every decode step, so that is built once)."""

    def __init__(self, hidden_size: int):
        self.hidden_size = hidden_size
        self.outputs: dict[int, tuple[paddle.Tensor, np.ndarray]] = {}
        self.key: tuple | None = None  # the tensors `args` points into (held: their memory must stay)
        self.args: tuple | None = None
        self.tokens: np.ndarray | None = None
        self.hidden: paddle.Tensor | None = None
        self.error = ctypes.create_string_buffer(_ERROR_SIZE)

    def prepare(self, key: tuple) -> bool:
        """Build `args` for these tensors: (ids, positions, slots, qsl, seq_lens, block_tables, plan,
        cache plan). False where the step is not one the C entry takes."""
        ids, positions, slots, qsl, lens, tables, plan, cache_plan = key
        t = int(ids.shape[0]) if len(ids.shape) == 1 else -1
        num_seqs = int(lens.shape[0]) if len(lens.shape) == 1 else -1
        if (
            t < 0
            or num_seqs < 0
            or ids.dtype != _I64
            or positions.dtype != _I64
            or slots.dtype != _I64
            or list(positions.shape) != [t]
            or list(slots.shape) != [t]
            or qsl.dtype != _I32
            or lens.dtype != _I32
            or tables.dtype != _I32
            or list(qsl.shape) != [num_seqs + 1]
            or len(tables.shape) != 2
            or int(tables.shape[0]) != num_seqs
            or not all(x.place.is_cpu_place() and x.is_contiguous() for x in key)
        ):
            return False
        if t not in self.outputs:
            self.outputs[t] = (paddle.empty([t, self.hidden_size], "float32"), np.empty(t, np.int64))
        self.hidden, self.tokens = self.outputs[t]
        self.args = (
            plan.data_ptr(),
            int(plan.shape[0]),
            cache_plan.data_ptr(),
            int(cache_plan.shape[0]),
            ids.data_ptr(),
            positions.data_ptr(),
            slots.data_ptr(),
            t,
            qsl.data_ptr(),
            lens.data_ptr(),
            num_seqs,
            tables.data_ptr(),
            int(tables.shape[1]),
            self.hidden.data_ptr() if t else None,
            self.tokens.ctypes.data if t else None,
            self.error,
            _ERROR_SIZE,
        )
        self.key = key
        return True


def greedy_step(ids, positions, meta, plan, cache_plan, buffers: StepBuffers):
    """(hidden, tokens) of the greedy stack step through ctypes, or None where it does not apply (the
    caller runs the op). The caller has checked that the step has no prompt-row mask and no out rows.
    tokens: None where a row's logits hold a NaN, as the op path says. Raises ValueError with the op's
    message on bad input."""
    fn = _entry if _entry is not None else _bind()
    if not fn:
        return None
    key = (
        ids,
        positions,
        meta.slot_mapping,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        plan,
        cache_plan,
    )
    held = buffers.key
    if held is None or not all(a is b for a, b in zip(key, held)):
        if not buffers.prepare(key):
            return None
    if fn(*buffers.args) != 0:
        raise ValueError(buffers.error.value.decode(errors="replace").strip().splitlines()[0])
    global steps
    steps += 1
    tokens = buffers.tokens.tolist()
    return buffers.hidden, None if -1 in tokens else tokens
