"""Python bindings of fd's native (C++) CPU operators, with the signatures of fd_kernels' package
docstring; `fd_kernels.reference` implements the same signatures in pure Paddle.

`load()` builds or imports the extension once per process. The op functions call Paddle's custom-op
entry point directly rather than the generated wrappers, which only add a mode check and list handling
on a path called ~10 times per layer (docs/kernels-measurements.md has the cost).
"""

from __future__ import annotations

import ctypes
import operator
import os
import sys
from dataclasses import dataclass
from itertools import chain

import numpy as np
import paddle
from paddle.utils.dlpack import from_dlpack

from fd_kernels import packing
from fd_kernels.build import library_path as _library_path
from fd_kernels.build import load as _build_load
from fd_kernels.native.sampler import sample  # noqa: F401 - the `sample` op works on numpy, via ctypes
from fd_kernels.native.stack_step import StepBuffers, greedy_step
from fd_kernels.native.thp import huge_pages  # noqa: F401 - memory advice, via ctypes

_ext = None  # names of the registered ops once loaded
_run = None  # paddle._C_ops._run_custom_op once loaded: (op name, *inputs, *attrs) -> list of outputs
ISA_NAMES = {4: "amx", 3: "avx512bf16", 2: "avx512", 1: "avx2", 0: "scalar"}
# The levels that compute quantized linears' prompt rows in bf16 (csrc/amx.cc: AMX tiles, or AVX512-BF16
# dot products on the same operands).
BF16_PROMPT_ISAS = ("amx", "avx512bf16")
# The values FD_KERNELS_ISA lowers the level to (csrc/kernels.cc's detect_isa; any other value is ignored).
FORCED_ISAS = ("avx512bf16", "avx512", "avx2", "scalar")


def load():
    """Build (first time) or import the cached kernels. Raises fd_kernels.errors.KernelBuildError."""
    global _ext, _run
    if _ext is None:
        _ext = _build_load()
        _run = paddle._C_ops._run_custom_op
        _keep_freed_memory()
    return _ext


def _keep_freed_memory() -> None:
    """Keep activation-sized blocks in glibc's heap instead of mmap/munmap per allocation.

    Paddle's CPU tensors come from malloc; glibc serves blocks above its mmap threshold with fresh mmaps,
    so every op writing a multi-MB output (a 512-token prefill's [512, 1536] activations) would pay a
    page fault per page touched (docs/kernels-measurements.md). Raising the thresholds to 64/128 MiB
    keeps freed activations for reuse. Process-wide by nature; FD_KERNELS_MALLOPT=0 turns it off.
    """
    if os.environ.get("FD_KERNELS_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): nothing to tune
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    libc.mallopt(m_mmap_threshold, 64 << 20)
    libc.mallopt(m_trim_threshold, 128 << 20)


_ISA: str | None = None


def active_isa() -> str:
    """The instruction set the kernels dispatch to in this process (FD_KERNELS_ISA can lower it)."""
    global _ISA
    if _ISA is None:
        load()
        _ISA = ISA_NAMES[int(_run("fd_active_isa", paddle.zeros([1]))[0].numpy()[0])]
    return _ISA


QGEMM_PATHS = {2: "avx512vnni", 1: "avx2", 0: "scalar"}


def qgemm_path() -> str:
    """The GGUF block GEMM's instantiation in this process (csrc/qgemm.cc): avx512vnni, avx2 or scalar."""
    fn = ctypes.CDLL(_library_path()).fd_qgemm_path
    fn.restype = ctypes.c_int32
    return QGEMM_PATHS[int(fn())]


def decode_region_steps() -> int:
    """Decoder-stack steps this process ran in one parallel region (csrc/decode_region.cc): pure-decode
    steps of a few rows on GGUF block weights."""
    fn = ctypes.CDLL(_library_path()).fd_decode_region_steps
    fn.restype = ctypes.c_int64
    return int(fn())


def decode_region_head_steps() -> int:
    """Of decode_region_steps, those that also ran the LM head's GEMM and argmax inside the region (greedy
    steps whose head is GGUF blocks; FD_DECODE_REGION_HEAD=0 runs it after the region instead)."""
    fn = ctypes.CDLL(_library_path()).fd_decode_region_head_steps
    fn.restype = ctypes.c_int64
    return int(fn())


def read_bytes(buf: np.ndarray) -> int:
    """Reads every byte of the C-contiguous `buf` once, each OpenMP thread its own contiguous share with
    the widest vector loads the active ISA has (csrc/qgemm.cc's fd_read_bytes): the "read once" that the
    decode roofline compares a step with. Returns nonzero if and only if a byte of `buf` is nonzero."""
    global _read_bytes
    if _read_bytes is None:
        load()
        fn = ctypes.CDLL(_library_path()).fd_read_bytes
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        fn.restype = ctypes.c_uint64
        _read_bytes = fn
    if not buf.flags.c_contiguous:
        raise ValueError("read_bytes: the buffer must be C-contiguous")
    return int(_read_bytes(buf.ctypes.data, buf.nbytes))


_read_bytes = None  # the library's fd_read_bytes through ctypes, bound on first use


def omp_thread_ids() -> list[int]:
    """OS thread ids of the OpenMP team the kernels run on, by thread number (0: the calling thread)."""
    load()
    return [int(t) for t in _run("fd_omp_thread_ids", paddle.zeros([1]))[0].numpy()]


def exp2_nonpos(x: paddle.Tensor) -> paddle.Tensor:
    """2^x elementwise (x <= 0) by the prompt attention softmax's exp (csrc/vexp.h), for its tests."""
    load()
    return _run("fd_exp2_nonpos", x)[0]


@dataclass
class LinearWeight:
    """A weight packed for `linear`, resident as Paddle tensors."""

    in_features: int
    out_features: int
    quantization: str | None  # None, "wint8", "wint4", or "gguf:<type id>"
    kind: int
    group: int
    packed: paddle.Tensor
    scales: paddle.Tensor
    mins: paddle.Tensor
    bias: paddle.Tensor
    has_bias: bool
    host: packing.Packed  # kept for dequantize(); its arrays are the memory of packed / scales / mins
    tiles: paddle.Tensor | None = None  # see amx_tiles()

    def dequantize(self) -> np.ndarray:
        """float32 [out, in]: the weight the kernel actually multiplies by (tests, debugging)."""
        return self.host.dequantize()

    def amx_tiles(self) -> paddle.Tensor:
        """The bf16 tiles the bf16 prompt rows multiply by (csrc/amx.cc), made on first use and kept: 2 bytes
        per weight beside the packed ones, paid only by the linears that see prompt rows, instead of
        dequantizing the weight in every prefill call. Empty (the kernel then dequantizes per call, to the
        same values) for fp32 weights, off the bf16 levels (BF16_PROMPT_ISAS), and with FD_AMX_PREPACK=0."""
        if self.tiles is None:
            if (
                self.kind == packing.KIND_F32
                or active_isa() not in BF16_PROMPT_ISAS
                or os.environ.get("FD_AMX_PREPACK") == "0"
            ):
                self.tiles = _empty("int16")
            else:
                try:
                    self.tiles = _run(
                        "fd_amx_tiles",
                        self.packed,
                        self.scales,
                        self.mins,
                        self.out_features,
                        self.in_features,
                        self.kind,
                        self.group,
                    )[0]
                except OSError as exc:
                    raise _bad_input(exc) from None
        return self.tiles


def _shared(a: np.ndarray) -> paddle.Tensor:
    """A flat Paddle tensor over the numpy array's memory (dlpack keeps the array alive): the packed
    weights exist once, not once in numpy for dequantize() and again in Paddle. Flat because numpy may
    export any stride for a dimension of size 1, which Paddle then reads as a non-contiguous layout (the
    ops take the packed arrays by size, not shape)."""
    return from_dlpack(np.ascontiguousarray(a).reshape(-1))


def _upload(p: packing.Packed, quantization: str | None) -> LinearWeight:
    load()
    bias = p.bias if p.bias is not None else np.zeros(1, dtype=np.float32)
    return LinearWeight(
        in_features=p.in_features,
        out_features=p.out_features,
        quantization=quantization,
        kind=p.kind,
        group=p.group,
        packed=_shared(p.data),
        scales=_shared(p.scales),
        mins=_shared(p.mins),
        bias=paddle.to_tensor(bias),
        has_bias=p.bias is not None,
        host=p,
    )


# "gguf": a GGUF tensor the loader already dequantized, used as given (as in the reference ops).
_PACKERS = {
    None: packing.pack_f32,
    "gguf": packing.pack_f32,
    "wint8": packing.pack_wint8,
    "wint4": packing.pack_wint4,
}


def prepare_linear(
    weight: np.ndarray,
    bias: np.ndarray | None = None,
    quantization: str | None = None,
    row_scale: np.ndarray | None = None,
):
    """Pack a float32 [out, in] weight (HF layout) once at load time. `row_scale`: wint8 only, the
    per-row scales to quantize with (packing.pack_wint8)."""
    if quantization not in _PACKERS:
        raise ValueError(
            f"quantization {quantization!r} is not supported: use None, 'gguf', 'wint8' or 'wint4'"
        )
    weight = np.asarray(weight, dtype=np.float32)
    if weight.ndim != 2:
        raise ValueError(f"linear weight must be 2-D [out, in], got shape {weight.shape}")
    if row_scale is not None:
        if quantization != "wint8":
            raise ValueError(f"row_scale applies to wint8 only, not {quantization!r}")
        return _upload(packing.pack_wint8(weight, bias, row_scale), quantization)
    return _upload(_PACKERS[quantization](weight, bias), quantization)


def prepare_linear_gguf(raw: np.ndarray, ggml_type: int, in_features: int, bias: np.ndarray | None = None):
    """Use a GGUF tensor's raw quantized rows ([out, bytes_per_row] uint8) directly: Q4_0, Q4_1, Q8_0
    stay quantized in the kernel; F32/F16 become fp32 panels."""
    return _upload(packing.pack_gguf(raw, ggml_type, in_features, bias), f"gguf:{ggml_type}")


def _bad_input(exc: OSError) -> ValueError:
    """Paddle reports a failed PD_CHECK as OSError with a source location; keep the first line."""
    return ValueError(str(exc).strip().splitlines()[0])


_EMPTY: dict[str, paddle.Tensor] = {}


def _empty(dtype: str) -> paddle.Tensor:
    """A zero-element tensor of `dtype`, made once: what the ops take for an absent optional input."""
    if dtype not in _EMPTY:
        _EMPTY[dtype] = paddle.zeros([0], dtype=dtype)
    return _EMPTY[dtype]


def _rows_for(prompt_rows: paddle.Tensor | None, x: paddle.Tensor) -> paddle.Tensor:
    """The prompt-row mask an op passes to C++: the step's mask where it describes x's rows, else empty.
    A mask of another length belongs to the step, not to this input (an LM head over the sampled rows,
    an MoE expert over its routed subset): those rows are computed on their usual path."""
    if prompt_rows is None or len(x.shape) != 2 or x.shape[0] != prompt_rows.shape[0]:
        return _empty("uint8")  # the mask the ops take for "no prompt rows"
    return prompt_rows


def linear(x: paddle.Tensor, lw: LinearWeight, prompt_rows: paddle.Tensor | None = None) -> paddle.Tensor:
    """x @ W^T (+ b). `prompt_rows` (uint8 [T], 1 on the step's prompt-token rows; None when the step has
    none) matters on the bf16 levels only (BF16_PROMPT_ISAS: AMX, or AVX512-BF16): there the quantized
    linears compute those rows in bf16 (csrc/amx.cc) and all other rows on their usual path (fp32 for
    wint8 / wint4, fixed-point activations for GGUF blocks: csrc/qgemm_impl.h), so prefill gets the bf16
    speed while a token's numerics stay independent of its batch. fp32 weights compute every row in fp32."""
    if x.shape[-1] != lw.in_features:
        raise ValueError(f"linear: x has {x.shape[-1]} features, the weight expects {lw.in_features}")
    rows = _rows_for(None if lw.kind == packing.KIND_F32 else prompt_rows, x)
    tiles = lw.amx_tiles() if rows.shape[0] else _empty("int16")
    try:
        return _run(
            "fd_linear",
            x,
            lw.packed,
            lw.scales,
            lw.mins,
            lw.bias,
            rows,
            tiles,
            lw.out_features,
            lw.kind,
            lw.group,
            lw.has_bias,
        )[0]
    except OSError as exc:
        raise _bad_input(exc) from None


def linear_argmax(x: paddle.Tensor, lw: LinearWeight) -> list[int] | None:
    """Each row's first argmax of linear(x, lw) (no prompt rows) without a logits tensor: csrc/
    lm_head_argmax.cc computes the same logits into its own scratch and scans them where they were
    written. None when a row holds a NaN."""
    shape = x.shape
    if len(shape) != 2 or shape[1] != lw.in_features:
        raise ValueError(f"linear_argmax: x must be [rows, {lw.in_features}], got {shape}")
    try:
        out = _run(
            "fd_linear_argmax",
            x,
            lw.packed,
            lw.scales,
            lw.mins,
            lw.bias,
            lw.out_features,
            lw.kind,
            lw.group,
            lw.has_bias,
        )[0]
    except OSError as exc:
        raise _bad_input(exc) from None
    # One row (batch-1 decode): item() reads the scalar without the numpy view's cost.
    tokens = [out.item()] if shape[0] == 1 else np.from_dlpack(out).tolist()
    return None if -1 in tokens else tokens


def embedding(ids: paddle.Tensor, lw: LinearWeight) -> paddle.Tensor:
    """Rows `ids` (output features) of a GGUF block weight as fp32 [*ids.shape, in_features], the values
    gguf's dequantizer gives: an embedding lookup straight from the (tied) LM head's blocks."""
    try:
        return _run("fd_linear_rows", ids, lw.packed, lw.out_features, lw.in_features, lw.kind)[0]
    except OSError as exc:
        raise _bad_input(exc) from None


def rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    try:
        return _run("fd_rms_norm", x, weight, float(eps))[0]
    except OSError as exc:
        raise _bad_input(exc) from None


def fused_add_rms_norm(x, residual, weight, eps: float):
    """Returns (rms_norm(x + residual) * weight, x + residual); the inputs are not modified."""
    try:
        out, res = _run("fd_fused_add_rms_norm", x, residual, weight, float(eps))
    except OSError as exc:
        raise _bad_input(exc) from None
    return out, res


def silu_and_mul(x: paddle.Tensor) -> paddle.Tensor:
    try:
        return _run("fd_silu_and_mul", x)[0]
    except OSError as exc:
        raise _bad_input(exc) from None


def rotary_embedding(positions, q, k, cos_sin_cache, head_dim: int):
    """NeoX rotary applied in place on q and k; returns (q, k). Paddle hands custom ops a contiguous copy
    of a strided view and drops in-place writes to it, so a view (a column slice of a fused qkv, as the
    attention layer passes) is copied here first and the rotated copy returned: use the return value."""
    if not q.is_contiguous():
        q = q.contiguous()
    if not k.is_contiguous():
        k = k.contiguous()
    try:
        _run("fd_rotary_embedding", positions, q, k, cos_sin_cache, int(head_dim))
    except OSError as exc:
        raise _bad_input(exc) from None
    return q, k


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, k_scales=None, v_scales=None) -> None:
    """Write k/v [T, nkv, hd] into the caches at slot_mapping (negative slots are skipped). With scales,
    the caches are int8 and each row is quantized (the C8 cache, csrc/c8_impl.h); without, they are
    float32, or bfloat16 and each value is rounded to nearest even (csrc/bf16_impl.h)."""
    try:
        if k_scales is None:
            _run("fd_reshape_and_cache", k, v, k_cache, v_cache, slot_mapping)
        else:
            _run("fd_reshape_and_cache_s8", k, v, k_cache, v_cache, k_scales, v_scales, slot_mapping)
    except OSError as exc:
        raise _bad_input(exc) from None


def paged_attention(q, k_cache, v_cache, meta, scale: float, k_scales=None, v_scales=None) -> paddle.Tensor:
    """The step's meta.prompt_rows goes along: a generated-token query takes its decode step's kernel path
    even inside a many-query step (a recompute after preemption); see csrc/attn_impl.h."""
    rows = getattr(meta, "prompt_rows", None)
    if rows is None or rows.shape[0] != q.shape[0]:
        rows = _rows_for(None, q)
    try:
        if k_scales is None:
            return _run(
                "fd_paged_attention",
                q,
                k_cache,
                v_cache,
                meta.query_start_loc,
                meta.seq_lens,
                meta.block_tables,
                rows,
                float(scale),
            )[0]
        return _run(
            "fd_paged_attention_s8",
            q,
            k_cache,
            v_cache,
            k_scales,
            v_scales,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            rows,
            float(scale),
        )[0]
    except OSError as exc:
        raise _bad_input(exc) from None


# ---- encoder (BERT) ops: csrc/encoder_kernels.cc, glue in csrc/encoder_ops.cc


def varlen_attention(q, k, v, cu_seqlens, scale: float) -> paddle.Tensor:
    """Bidirectional attention inside each sequence of a packed batch. q/k/v may be column slices of one
    fused qkv output reshaped to [T, nh, hd]: the glue reads any view whose heads are dense by its row
    stride, and copies other layouts."""
    try:
        return _run("fd_varlen_attention", q, k, v, cu_seqlens, float(scale))[0]
    except OSError as exc:
        raise _bad_input(exc) from None


def gelu(x: paddle.Tensor) -> paddle.Tensor:
    try:
        return _run("fd_gelu", x)[0]
    except OSError as exc:
        raise _bad_input(exc) from None


def add_layer_norm(x, residual, weight, bias, eps: float) -> paddle.Tensor:
    try:
        return _run("fd_add_layer_norm", x, residual, weight, bias, float(eps))[0]
    except OSError as exc:
        raise _bad_input(exc) from None


# ------------------------------------------------------------------------------------- decoder stack
# Per layer, the linears fd_decoder_stack_plan reads (csrc/decoder_stack_op.cc), in its order.
_STACK_LINEARS = ("qkv", "o_proj", "gate_up", "down")


@dataclass
class DecoderStack:
    """A Llama-family decoder packed for `decoder_stack`, once after loading: the weight plan (raw
    pointers, checked once, into the tensors listed here, which this object keeps alive) and the cache
    plan of the last KV caches it ran on."""

    plan: paddle.Tensor
    tensors: list[paddle.Tensor]  # every tensor the plan points into: never let them go before it
    embeds_tokens: bool = False  # the plan holds the token table: `decoder_stack` takes ids for x
    has_head: bool = False  # the plan holds the LM head: `decoder_stack_greedy` applies
    _kv_tensors: list | None = None
    _kv_plan: paddle.Tensor | None = None
    _kv_layers: list | None = None  # the per-layer tuples last bound, where every layer's was a tuple
    hidden_size: int = 0
    _step: StepBuffers | None = None  # the greedy step's ctypes state (native/stack_step.py)

    def step_buffers(self) -> StepBuffers:
        if self._step is None:
            self._step = StepBuffers(self.hidden_size)
        return self._step

    def cache_plan(self, kv_caches: list) -> paddle.Tensor:
        """The cache plan for these caches: bound again whenever a cache tensor is not the one bound last
        (the runner passes the same tensors every step, so that is the first step only). A layer's
        caches in a tuple (runner/kv_cache.py) cannot change, so the same tuples are the same tensors
        and a step compares one identity a layer; other containers are compared tensor by tensor."""
        layers = self._kv_layers
        if layers is not None and len(kv_caches) == len(layers) and all(map(operator.is_, kv_caches, layers)):
            return self._kv_plan
        flat = list(chain.from_iterable(kv_caches))
        bound = self._kv_tensors
        if bound is None or len(flat) != len(bound) or not all(map(operator.is_, flat, bound)):
            try:
                self._kv_plan = _run("fd_decoder_stack_bind", self.plan, flat)[0]
            except OSError as exc:
                raise _bad_input(exc) from None
            self._kv_tensors = flat  # the plan points into these: keep them alive with it
        self._kv_layers = list(kv_caches) if all(type(layer) is tuple for layer in kv_caches) else None
        return self._kv_plan


def prepare_decoder_stack(
    layers: list[dict],
    final_norm: paddle.Tensor,
    cos_sin_cache: paddle.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    scale: float,
    embedding=None,
    head: LinearWeight | None = None,
) -> DecoderStack:
    """Pack a decoder for `decoder_stack`. Each layer is a dict of input_norm, qkv, o_proj, post_norm,
    gate_up, down (LinearWeight for the four linears, fp32 [hidden] tensors for the norms) and q_norm /
    k_norm (fp32 [head_dim] tensors, or None for models without per-head q/k norms). `embedding`: None,
    the token table as `embedding` reads it (a GGUF block LinearWeight [vocab, hidden]) or an fp32
    [vocab, hidden] tensor (F.embedding's table); with it, `decoder_stack` also takes token ids.
    `head`: None, or the LM head's LinearWeight [vocab, hidden] as `linear_argmax` takes it; with it,
    `decoder_stack_greedy` applies."""
    load()
    qk_norm = bool(layers) and layers[0]["q_norm"] is not None
    weights: list[paddle.Tensor] = []
    meta: list[int] = []
    for layer in layers:
        if (layer["q_norm"] is not None) != qk_norm or (layer["k_norm"] is not None) != qk_norm:
            raise ValueError("decoder_stack: every layer must have q/k norms, or none")
        weights.append(layer["input_norm"])
        for name in _STACK_LINEARS:
            lw = layer[name]
            weights += [lw.packed, lw.scales, lw.mins, lw.bias, lw.amx_tiles()]
            meta += [lw.out_features, lw.kind, lw.group, int(lw.has_bias)]
            if name == "o_proj":
                weights.append(layer["post_norm"])
        if qk_norm:
            weights += [layer["q_norm"], layer["k_norm"]]
    hidden = int(final_norm.shape[0])
    table, rows, kind = _stack_embedding(embedding)
    if head is not None:  # as a layer's linear; no tiles: the head never gets prompt rows
        weights += [head.packed, head.scales, head.mins, head.bias, _empty("int16")]
        meta += [head.out_features, head.kind, head.group, int(head.has_bias)]
    try:
        plan = _run(
            "fd_decoder_stack_plan",
            final_norm,
            cos_sin_cache,
            table,
            weights,
            meta,
            hidden,
            int(num_heads),
            int(num_kv_heads),
            int(head_dim),
            qk_norm,
            float(eps),
            float(scale),
            rows,
            kind,
            head is not None,
        )[0]
    except OSError as exc:
        raise _bad_input(exc) from None
    tensors = [final_norm, cos_sin_cache, table, *weights]
    return DecoderStack(
        plan=plan, tensors=tensors, embeds_tokens=kind >= 0, has_head=head is not None, hidden_size=hidden
    )


def _stack_embedding(embedding) -> tuple[paddle.Tensor, int, int]:
    """(table, rows, kind) of fd_decoder_stack_plan's Embedding (csrc/decoder_stack_op.cc): GGUF blocks
    as `embedding` reads them, fp32 rows (kind KIND_F32), or none (an empty tensor, kind -1)."""
    if embedding is None:
        return _empty("uint8"), 0, -1
    if isinstance(embedding, paddle.Tensor):
        return embedding, int(embedding.shape[0]), packing.KIND_F32
    return embedding.packed, int(embedding.out_features), int(embedding.kind)


def prompt_tile_min_rows() -> int:
    """The prompt-row count from which kS8 / kU4 linears take the bf16 tiles (other sums than below it);
    0 where no row count changes a row's numbers. See kernels.h."""
    global _TILE_ROWS
    if _TILE_ROWS is None:
        load()
        _TILE_ROWS = int(_run("fd_prompt_tile_min_rows", paddle.zeros([1]))[0].numpy()[0])
    return _TILE_ROWS


_TILE_ROWS: int | None = None


def decoder_stack(
    x, positions, kv_caches, meta, stack: DecoderStack, prompt_rows=None, out=None
) -> paddle.Tensor:
    """Every decoder layer and the final norm in one op: what the per-op loop of
    fdcli_engine/models/decoder.py computes from the embeddings x [T, hidden], bit for bit, writing the
    KV caches the same way. Where the stack holds the token table (`stack.embeds_tokens`), x may be the
    token ids int64 [T]: the op looks their rows up first, as `embedding` / F.embedding would.
    `prompt_rows` reaches every linear as in `linear`. `out`: None, or the metadata of the rows that are
    read (fdcli_engine/runner/read_rows.py: `rows`, query_start_loc, seq_lens, block_tables,
    prompt_rows of those rows alone); the last layer then computes only them (every row's K/V still
    written) and the result is [len(rows), hidden]."""
    return _stack_call(x, positions, kv_caches, meta, stack, prompt_rows, out, False)[0]


def decoder_stack_greedy(
    x, positions, kv_caches, meta, stack: DecoderStack, prompt_rows=None, out=None
) -> tuple[paddle.Tensor, list[int] | None]:
    """`decoder_stack` and, in the same op, each output row's first argmax of the LM head's logits
    (`stack.has_head`): (hidden, tokens) with the tokens `linear_argmax(hidden, head)` gives, or None
    where a row's logits hold a NaN. A step of token ids with no prompt-row mask and no out rows (a
    decode step) runs through ctypes (native/stack_step.py): its hidden states are then the stack's
    buffer, written again by its next such step, so a caller reads them within the step and keeps none."""
    if prompt_rows is None and out is None and stack.embeds_tokens and stack.has_head and len(x.shape) == 1:
        got = greedy_step(x, positions, meta, stack.plan, stack.cache_plan(kv_caches), stack.step_buffers())
        if got is not None:
            return got
    hidden, tokens = _stack_call(x, positions, kv_caches, meta, stack, prompt_rows, out, True)
    # One row (batch-1 decode): item() reads the scalar without the numpy view's cost.
    ids = [tokens.item()] if tokens.shape[0] == 1 else np.from_dlpack(tokens).tolist()
    return hidden, None if -1 in ids else ids


def _stack_call(x, positions, kv_caches, meta, stack, prompt_rows, out, greedy: bool) -> list:
    # Token ids [T] are the step's rows, as the step's mask describes them.
    rows = _rows_for(prompt_rows, x) if len(x.shape) == 2 or prompt_rows is None else prompt_rows
    if out is None:
        i64 = _empty("int64")
        out_args = (i64, i64, i64, i64, _empty("uint8"))
    else:
        out_rows = out.prompt_rows if out.prompt_rows is not None else _empty("uint8")
        out_args = (out.rows, out.query_start_loc, out.seq_lens, out.block_tables, out_rows)
    cache_plan = stack.cache_plan(kv_caches)
    try:
        return _run(
            "fd_decoder_stack",
            x,
            positions,
            meta.slot_mapping,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            rows,
            stack.plan,
            cache_plan,
            *out_args,
            greedy,
        )
    except OSError as exc:
        raise _bad_input(exc) from None
