"""`fd serve` places its processes (threads.front_end_placement): by default the engine core's main thread
on the first CPU and every front-end thread off it (FD_CPU_OMP_THREADS_BIND=auto), and the front end at
SCHED_IDLE (FD_FRONTEND_PRIORITY=idle) while the core keeps the server's scheduling policy. The test server
runs --threads 1."""

from __future__ import annotations

import os

import psutil

from fdcli_engine.threads import bind_plan


def test_front_end_and_core_threads_are_placed(server):
    allowed = sorted(os.sched_getaffinity(0))  # this process never binds itself
    plan = bind_plan(1, "auto", allowed)
    threads = [t.id for t in psutil.Process(server.proc.pid).threads()]
    front_end = {tid: sorted(os.sched_getaffinity(tid)) for tid in threads}
    core = server.core_process()
    core_main = sorted(os.sched_getaffinity(core.pid))
    assert {os.sched_getscheduler(tid) for tid in threads} == {os.SCHED_IDLE}
    assert os.sched_getscheduler(core.pid) == os.sched_getscheduler(0)
    if plan is None:  # one CPU: nothing to place
        assert core_main == allowed and all(c == allowed for c in front_end.values())
    else:
        omp, front = plan
        assert core_main == omp[:1]
        assert all(c == front for c in front_end.values()), front_end
