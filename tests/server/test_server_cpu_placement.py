"""`fd serve` places its processes (threads.front_end_placement): by default the engine core's main thread
on the first CPU and every front-end thread off it (FD_CPU_OMP_THREADS_BIND=auto), both at the priority
the server started with (FD_FRONTEND_PRIORITY=normal). The test server runs --threads 1."""

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
    policy, nice = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    assert {os.sched_getscheduler(tid) for tid in threads} == {policy}
    assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads} == {nice}
    assert os.sched_getscheduler(core.pid) == policy
    if plan is None:  # one CPU: nothing to place
        assert core_main == allowed and all(c == allowed for c in front_end.values())
    else:
        omp, front = plan
        assert core_main == omp[:1]
        assert all(c == front for c in front_end.values()), front_end
