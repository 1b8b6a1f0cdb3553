"""The engine's op dispatch: the names layers/ and models/ call, bound to one of fd_kernels' two
implementations, which share one signature per op:
- `fd_kernels.reference`: pure Paddle. The test oracle, and the fallback when no compiler exists.
- `fd_kernels.native`: the Python bindings of the C++ custom operators (kernels/), compiled on first
  use and cached.

`FD_KERNELS=reference` (or `use("reference")`) forces the reference; the default `auto` uses the C++
operators when they build and load, else the reference with one warning. Names are bound once at
import (and on `use()`), so a call costs no lookup.

The signatures are fd_kernels' (its package docstring); OP_NAMES lists the ops.
"""

from __future__ import annotations

import logging
import os

from fd_kernels import OP_NAMES, reference

logger = logging.getLogger(__name__)
backend = "reference"


def _load_native():
    try:
        from fd_kernels import build, native  # noqa: PLC0415

        if not build.is_built():  # a first start compiles for a minute or so: say so, or it looks hung
            logger.info(
                "building fd's C++ kernels into %s (once per machine and fd version, ~1 min)",
                build.build_dir(),
            )
        native.load()
        forced = os.environ.get("FD_KERNELS_ISA")
        if forced and forced not in native.FORCED_ISAS:
            logger.warning(
                "FD_KERNELS_ISA=%s is not a kernel level (use one of %s); running the CPU's best, %s",
                forced,
                ", ".join(native.FORCED_ISAS),
                native.active_isa(),
            )
        return native
    except Exception as exc:  # a missing compiler or a failed build must not stop the engine
        logger.warning("fd C++ kernels unavailable (%s); using the pure-Paddle reference ops", exc)
        return None


def use(name: str | None = None) -> str:
    """Bind the op names to an implementation: "reference", "native" or "auto". Returns the one chosen."""
    global backend
    name = (name or os.environ.get("FD_KERNELS", "auto")).lower()
    impl = reference
    if name in ("auto", "native"):
        native = _load_native()
        if native is not None:
            impl = native
        elif name == "native":
            raise RuntimeError("FD_KERNELS=native but the C++ kernels could not be built or loaded")
    elif name != "reference":
        raise ValueError(f"FD_KERNELS={name!r}: use auto, native or reference")
    g = globals()
    for op in OP_NAMES:
        g[op] = getattr(impl, op, getattr(reference, op, None))  # None: native-only (decoder_stack)
    backend = "native" if impl is not reference else "reference"
    return backend


def describe() -> str:
    """The bound implementation for logs: "native (avx512)" (the ISA the kernels dispatch to) or
    "reference", so a failed kernel build is visible where speed is reported."""
    if backend != "native":
        return "reference"
    from fd_kernels import native  # noqa: PLC0415

    return f"native ({native.active_isa()})"


use()


def bind_engine_threads(num_threads: int) -> list[int] | None:
    """Pin the OpenMP team the C++ kernels run on as `threads.bind_plan` says (FD_CPU_OMP_THREADS_BIND;
    unset means no binding: a process fd does not own keeps its threads free). Returns the CPUs, or None
    (no plan, or the reference ops, which have no team of their own)."""
    from fdcli_engine.threads import BIND_ENV, allowed_cpus, bind_plan  # noqa: PLC0415

    plan = bind_plan(num_threads, os.environ.get(BIND_ENV), allowed_cpus())
    if plan is None or backend != "native":
        return None
    from fd_kernels.native import omp_thread_ids  # noqa: PLC0415

    omp, _ = plan
    for tid, cpu in zip(omp_thread_ids(), omp):
        os.sched_setaffinity(tid, {cpu})
    return omp
