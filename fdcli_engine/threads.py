"""One OpenMP runtime, sized once: Paddle's bundled libiomp5 serves Paddle's own kernels and fd's."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import io
import os
from dataclasses import dataclass


def import_paddle():
    """Import paddle without its start-up banner: it prints a warning to stderr whenever
    OMP_NUM_THREADS > 1, which fd sets on purpose (Paddle would otherwise use one core)."""
    with contextlib.redirect_stderr(io.StringIO()):
        import paddle
    return paddle


def set_num_threads(n: int) -> None:
    """Resize the thread pool after paddle is imported (OMP_NUM_THREADS only counts before)."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    paddle = import_paddle()
    libs = glob.glob(os.path.join(os.path.dirname(paddle.__file__), "libs", "libiomp5*.so*"))
    for path in libs:
        try:
            ctypes.CDLL(path).omp_set_num_threads(ctypes.c_int(n))
        except (OSError, AttributeError):
            continue


# CPU placement (vLLM's VLLM_CPU_OMP_THREADS_BIND): "auto" (the engine-core process's default), "nobind", or
# a CPU list such as "0-3" or "0,2".
BIND_ENV = "FD_CPU_OMP_THREADS_BIND"
RANK_SEPARATOR = "|"  # "0-31|32-63": one CPU list per engine rank (vLLM's form; parallel_config.py)
_allowed: list[int] | None = None


def set_omp_defaults(*, bind: bool) -> None:
    """The OpenMP settings an fd engine runs with, where the environment does not give them: set before
    paddle is imported (its OpenMP runtime reads them when it starts). The engine-core process and its
    tensor-parallel ranks (set_engine_process_env) get them, and so do benchmarks whose in-process engine
    must run as the server's does.

    KMP_BLOCKTIME=1: OpenMP threads that wait spin for KMP_BLOCKTIME (200 ms) before sleeping. In the
    server they share the cores with the front end, which runs between steps: a thread still spinning
    then holds a core the front end needs. 1 ms covers the gaps between the kernels of one step and lets
    the threads sleep between steps; 0 would sleep and wake between every kernel, hundreds per step
    (docs/engine-measurements.md).
    bind: also pin the OpenMP threads, one per CPU (FD_CPU_OMP_THREADS_BIND=auto; bind_plan says why).
    """
    os.environ.setdefault("KMP_BLOCKTIME", "1")
    if bind:
        os.environ.setdefault(BIND_ENV, "auto")


def set_engine_process_env(num_threads: int, cpus: list[int] | None, *, bind: bool) -> None:
    """The environment of a process fd starts to run its engine (the engine core, a tensor-parallel rank),
    before paddle is imported. The environment wins, except where the process has its own CPU set.

    cpus: a data- or tensor-parallel rank's CPU set (dp_rank.rank_configs, parallel_config.tp_cpu_sets).
    The whole process is confined to it before paddle starts a thread (every later thread inherits it), and
    its OpenMP team gets num_threads threads bound in order. This overrides the inherited variables: a
    front end's FD_CPU_OMP_THREADS_BIND may hold every rank's lists ("0|1") and its OMP_NUM_THREADS the
    whole machine.
    bind: set_omp_defaults's (the engine core binds by default; a tensor-parallel rank always has cpus).
    """
    if cpus:
        # No sched_setaffinity (or not allowed): the bind list still applies.
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, set(cpus))
        os.environ[BIND_ENV] = ",".join(str(c) for c in cpus)
        os.environ["OMP_NUM_THREADS"] = str(num_threads)
    # Paddle reads OMP_NUM_THREADS once at import and defaults it to 1.
    os.environ.setdefault("OMP_NUM_THREADS", str(num_threads))
    set_omp_defaults(bind=bind)
    # Paddle's C++ INFO lines (the collective group's TCPStore announces its server and each connection)
    # are not the user's business; warnings and errors still print.
    os.environ.setdefault("GLOG_minloglevel", "1")


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on, as first seen (binding the calling thread later narrows what the
    OS reports for it, not what the process was given)."""
    global _allowed
    if _allowed is None:
        _allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return _allowed


def usable_cpu_count() -> int:
    """How many CPUs this process may use (a container's cpuset, taskset), not every core of the host."""
    return len(allowed_cpus()) or os.cpu_count() or 1


def parse_cpu_list(text: str) -> list[int]:
    """ "0-3,6" -> [0, 1, 2, 3, 6]; ValueError for anything else."""
    cpus: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 0 or last < first:
            raise ValueError(part)
        cpus += [c for c in range(first, last + 1) if c not in cpus]
    return cpus


def bind_plan(num_threads: int, value: str | None, allowed: list[int]) -> tuple[list[int], list[int]] | None:
    """(CPU of each OpenMP thread, CPUs of the server's front end), or None for no binding.

    Why bind: on a machine the engine fills, the front end (HTTP, detokenization) and the engine's threads
    share cores. Unbound, the scheduler runs the front end on whichever core it woke on, often the one
    running the engine's main thread, whose Python work between kernels every other thread then waits for
    at the next barrier. Bound, thread i keeps CPU i (no migrations), and the front end runs on a CPU the
    engine leaves free or else on the last one, whose thread only joins the parallel kernels.
    """
    value = (value or "nobind").strip().lower()
    if value == "nobind" or len(allowed) < 2:
        return None
    from fdcli_engine.errors import ConfigError

    if value == "auto":
        cpus = allowed
    else:
        try:
            cpus = parse_cpu_list(value)
        except ValueError:
            raise ConfigError(f"{BIND_ENV}={value!r}: use auto, nobind, or a CPU list such as 0-3") from None
        if not set(cpus) <= set(allowed):
            raise ConfigError(f"{BIND_ENV}={value!r}: this process may only use CPUs {allowed}")
    omp = [cpus[i % len(cpus)] for i in range(num_threads)]
    # A CPU no engine thread uses, else the last one: never thread 0's (len(cpus) > 1 when none is free).
    return omp, [c for c in allowed if c not in omp] or [cpus[-1]]


def place_io_threads(num_threads: int, prefix: str = "ZMQbg") -> list[int] | None:
    """Move this process's ZMQ background threads (the I/O thread every send wakes) onto the CPUs
    bind_plan leaves for the front end; returns those CPUs, or None (no binding, nothing moved).

    The engine core wakes its I/O thread once a step to send the step's outputs. Left on any CPU, the
    scheduler often wakes it on the main thread's CPU, which then waits for it inside the send; on the
    front end's CPUs it shares a core with the front end's own work for the same message.
    """
    plan = bind_plan(num_threads, os.environ.get(BIND_ENV), allowed_cpus())
    if plan is None:
        return None
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that just exited
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith(prefix):
                    os.sched_setaffinity(int(tid), set(plan[1]))
    return plan[1]


FRONT_END_PRIORITY_ENV = "FD_FRONTEND_PRIORITY"


@dataclass(frozen=True)
class FrontEndPlacement:
    cpus: list[int] | None  # None: left to the OS
    priority: str  # "normal", "idle", or a nice value "1".."19"


def front_end_placement(num_threads: int) -> FrontEndPlacement:
    """Where `fd serve`'s front end runs and at what priority; ConfigError for a bad variable.

    Priority (FD_FRONTEND_PRIORITY): "normal" (the default), a nice value 1-19, or "idle" (Linux's
    SCHED_IDLE). A lowered front end gives way to the engine's threads, but those are runnable through
    every step (OpenMP threads spin between kernels), so it starves while requests run: new requests
    are answered later the lower it goes (benchmarks/bench_frontend_priority.py; figures in
    docs/engine-measurements.md).
    """
    from fdcli_engine.errors import ConfigError

    priority = os.environ.get(FRONT_END_PRIORITY_ENV, "normal").strip().lower()
    if priority not in ("idle", "normal") and not (priority.isdigit() and 1 <= int(priority) <= 19):
        raise ConfigError(f"{FRONT_END_PRIORITY_ENV}={priority!r}: use normal, idle, or a nice value 1-19")
    if priority == "idle" and not hasattr(os, "SCHED_IDLE"):
        priority = "19"
    # "auto" unless set, as in the engine-core process (core_proc.build_core), without writing the
    # variable into this process's environment, where an in-process engine would read it.
    # Data parallelism's one list per rank ("0-31|32-63"): the ranks' threads use their union.
    value = os.environ.get(BIND_ENV, "auto").replace(RANK_SEPARATOR, ",")
    plan = bind_plan(num_threads, value, allowed_cpus())
    return FrontEndPlacement(plan[1] if plan else None, priority)


def place_front_end(placement: FrontEndPlacement) -> None:
    """Apply `placement` to every thread of this process (the server's front end, once it has started
    the engine core: a child inherits both); threads started later inherit it too."""
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):  # a thread that just exited
            if placement.cpus:
                os.sched_setaffinity(tid, set(placement.cpus))
            if placement.priority == "idle":
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            elif placement.priority != "normal":  # never raise a priority the process started with (nice -n)
                nice = max(int(placement.priority), os.getpriority(os.PRIO_PROCESS, tid))
                os.setpriority(os.PRIO_PROCESS, tid, nice)
