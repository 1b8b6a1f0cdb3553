"""CPU placement of the engine's OpenMP threads and the server's front end (fdcli_engine/threads.py).

The plan is checked as a pure function; the binding itself in a child process (binding pins threads of the
process that does it, and pytest's must stay free), by asking the OS where each OpenMP thread may run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fdcli_engine.errors import ConfigError
from fdcli_engine.threads import (
    FrontEndPlacement,
    allowed_cpus,
    bind_plan,
    front_end_placement,
    parse_cpu_list,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "threads, value, allowed, expected",
    [
        (2, "auto", [0, 1], ([0, 1], [1])),  # no free CPU: the front end shares the last thread's
        (1, "auto", [0, 1], ([0], [1])),  # a free CPU goes to the front end
        (3, "auto", [0, 1], ([0, 1, 0], [1])),  # more threads than CPUs: round robin, never thread 0's CPU
        (4, "auto", [2, 3, 5, 7], ([2, 3, 5, 7], [7])),
        (2, "5,7", [2, 3, 5, 7], ([5, 7], [2, 3])),
        (2, "0-1", [0, 1, 2], ([0, 1], [2])),
        (2, "nobind", [0, 1], None),
        (2, None, [0, 1], None),  # unset: a process fd does not own is left alone
        (2, "auto", [0], None),  # one CPU: nothing to place
        (1, "auto", [], None),  # no affinity API
    ],
)
def test_bind_plan(threads, value, allowed, expected):
    assert bind_plan(threads, value, allowed) == expected


def test_cpu_list_and_bad_values():
    assert parse_cpu_list("0-3,6,2") == [0, 1, 2, 3, 6]
    with pytest.raises(ConfigError, match="use auto, nobind, or a CPU list"):
        bind_plan(2, "fast", [0, 1])
    with pytest.raises(ConfigError, match="use auto, nobind, or a CPU list"):
        bind_plan(2, "3-1", [0, 1])
    with pytest.raises(ConfigError, match=r"may only use CPUs \[0, 1\]"):
        bind_plan(2, "0,4", [0, 1])


def test_front_end_placement(monkeypatch):
    monkeypatch.setenv("FD_CPU_OMP_THREADS_BIND", "nobind")
    monkeypatch.delenv("FD_FRONTEND_PRIORITY", raising=False)
    assert front_end_placement(2) == FrontEndPlacement(None, "normal")
    for value, expected in (("idle", "idle"), (" 19", "19"), ("NORMAL", "normal")):
        monkeypatch.setenv("FD_FRONTEND_PRIORITY", value)
        assert front_end_placement(2).priority == expected
    # Unset, the server binds as its engine core does (auto), without writing the variable anywhere.
    monkeypatch.delenv("FD_CPU_OMP_THREADS_BIND")
    plan = bind_plan(2, "auto", allowed_cpus())
    assert front_end_placement(2).cpus == (plan[1] if plan else None)
    assert "FD_CPU_OMP_THREADS_BIND" not in os.environ
    for bad in ("0", "-5", "20", "low"):
        monkeypatch.setenv("FD_FRONTEND_PRIORITY", bad)
        with pytest.raises(ConfigError, match="use normal, idle, or a nice value 1-19"):
            front_end_placement(2)


CHILD = """
import json, os
import fdcli_engine.ops as ops
from fdcli_engine.threads import allowed_cpus
allowed = allowed_cpus()
bound = ops.bind_engine_threads(int(os.environ["OMP_NUM_THREADS"]))
from fd_kernels.native import omp_thread_ids
tids = omp_thread_ids()
print(json.dumps({"backend": ops.backend, "allowed": allowed, "bound": bound, "tids": tids,
                  "main": os.getpid(), "cpus": [sorted(os.sched_getaffinity(t)) for t in tids]}))
"""


def _child_json(code: str, *argv: str, **popen) -> dict:
    """Run `code` in a fresh interpreter (placement changes the process that makes it); its last line of
    stdout, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=600, **popen
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_child(threads: int, bind: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "FD_CPU_OMP_THREADS_BIND": bind}
    env.pop("FD_KERNELS", None)
    return _child_json(CHILD, env=env)


def test_engine_threads_are_pinned_one_per_cpu():
    r = _run_child(2, "auto")
    assert r["backend"] == "native"
    assert len(set(r["tids"])) == 2 and r["tids"][0] == r["main"]  # thread 0 is the caller
    plan = bind_plan(2, "auto", r["allowed"])
    if plan is None:  # a one-CPU machine: nothing is bound
        assert r["bound"] is None and all(c == r["allowed"] for c in r["cpus"])
    else:
        assert r["bound"] == plan[0] and r["cpus"] == [[c] for c in plan[0]]


def test_nobind_leaves_threads_free():
    r = _run_child(2, "nobind")
    assert r["bound"] is None and all(c == r["allowed"] for c in r["cpus"])


IO_CHILD = """
import json, os, time, zmq
from fdcli_engine.threads import place_io_threads
ctx = zmq.Context()
sock = ctx.socket(zmq.PUSH)  # the context's I/O thread starts with its first socket, and names itself
def io_threads():
    return [t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith("ZMQbg")]
deadline = time.monotonic() + 10
while not io_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
cpus = place_io_threads(2)
io = io_threads()
print(json.dumps({"cpus": cpus, "io": [sorted(os.sched_getaffinity(int(t))) for t in io],
                  "main": sorted(os.sched_getaffinity(0))}))
sock.close(0)
ctx.term()
"""


@pytest.mark.parametrize("bind", ["auto", "nobind"])
def test_io_threads_leave_thread_zeros_cpu(bind):
    r = _child_json(IO_CHILD, env={**os.environ, "FD_CPU_OMP_THREADS_BIND": bind})
    plan = bind_plan(2, bind, allowed_cpus())
    assert r["io"] and r["cpus"] == (plan[1] if plan else None)
    assert all(c == (plan[1] if plan else r["main"]) for c in r["io"])  # the main thread is left alone


PLACE_CHILD = """
import json, os, sys, threading
from fdcli_engine.threads import FrontEndPlacement, place_front_end
stop = threading.Event()
worker = threading.Thread(target=stop.wait)
worker.start()
place_front_end(FrontEndPlacement(None, sys.argv[1]))
tids = [int(t) for t in os.listdir("/proc/self/task")]
print(json.dumps({"policy": sorted({os.sched_getscheduler(t) for t in tids}),
                  "nice": sorted({os.getpriority(os.PRIO_PROCESS, t) for t in tids}), "threads": len(tids)}))
stop.set()
"""


_POLICY, _NICE = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize(
    "priority, started_nice, policy, nice",
    [
        ("normal", _NICE, _POLICY, _NICE),
        ("idle", _NICE, os.SCHED_IDLE, _NICE),
        ("7", _NICE, _POLICY, max(7, _NICE)),
        ("7", max(12, _NICE), _POLICY, max(12, _NICE)),  # a priority the process started with is never raised
    ],
)
def test_place_front_end_sets_every_thread(priority, started_nice, policy, nice):
    r = _child_json(PLACE_CHILD, priority, preexec_fn=lambda: os.nice(started_nice - _NICE))
    assert r["threads"] >= 2 and r["policy"] == [policy] and r["nice"] == [nice]
