"""The tensor-parallel collectives (fdcli_engine.distributed): shm and gloo, 2 and 3 ranks as processes.

Reference: numpy. all_reduce must equal the rank-order fp32 sum ((x0 + x1) + x2) bit for bit on every
rank; all_gather numpy's concatenate. The inputs span six orders of magnitude so that another summation
order gives other bits (asserted, so the bit-equality test can fail). Each rank runs this file as a
script (`worker`), writing what it got to an .npz the test compares.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# (shape, how the rank passes it): "dense", or "strided" (a transposed view, not contiguous).
CASES = [
    ((1, 576), "dense"),
    ((16, 576), "dense"),
    ((3, 1001), "dense"),
    ((7, 5), "strided"),
    ((0, 4), "dense"),
]
HOST = "127.0.0.1"


def free_ports(n: int) -> list[int]:
    """n distinct ports no listener holds: all bound at once, so that no two picks (nor a listener bound
    before the call) share one, as closing each pick before the next could."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def inputs(rank: int, shape) -> np.ndarray:
    rng = np.random.default_rng([rank, *shape])
    mags = 10.0 ** rng.uniform(-3, 3, size=shape)
    return (rng.standard_normal(shape) * mags).astype(np.float32)


def rank_order_sum(xs: list[np.ndarray]) -> np.ndarray:
    acc = xs[0].copy()
    for x in xs[1:]:
        acc += x
    return acc


def make_group(backend: str, rank: int, world: int, port: int, timeout_s: float):
    """backend "shm-small": the shm group with 4 KiB slots, so that every case goes through in chunks
    (the last one partial)."""
    from fdcli_engine.distributed import init_tp_group
    from fdcli_engine.distributed.shm import ShmGroup

    if backend == "shm-small":
        return ShmGroup(rank, world, HOST, port, timeout_s=timeout_s, slot_bytes=4096)
    # No backend named: init_tp_group must pick shm for one node's ranks and gloo for one rank per node.
    return init_tp_group(rank, world, HOST, port, world if backend == "shm" else 1, timeout_s)


def worker(mode: str, backend: str, rank: int, world: int, port: int, out: str, timeout_s: float) -> int:
    import paddle

    from fdcli_engine.errors import FdError

    if mode == "stale":  # what a rank 0 SIGKILLed between creating the segment and unlinking it leaves
        from fdcli_engine.distributed import shm

        shm._library().fd_shm_create(shm.segment_name(HOST, port).encode(), world, 4096, 1, None, 0)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        group = make_group(backend, rank, world, port, timeout_s)
        if mode == "die":  # the last rank dies once the group is up; the others are in an all_reduce
            group.barrier()  # up on every rank: gloo's set-up may still be connecting pairs on the others
            if rank == world - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            group.all_reduce(paddle.ones([4]))
    except FdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    got = {}
    for shape, how in CASES:
        x = inputs(rank, shape)

        def tensor(x=x, how=how):  # a fresh one per call: all_reduce may overwrite its input
            return paddle.to_tensor(x.T.copy()).T if how == "strided" else paddle.to_tensor(x)

        key = "x".join(map(str, shape))
        got[f"sum_{key}"] = group.all_reduce(tensor()).numpy()
        if shape[0]:
            got[f"g0_{key}"] = group.all_gather(tensor(), axis=0).numpy()
            got[f"g1_{key}"] = group.all_gather(tensor(), axis=-1).numpy()
    # Other dtypes take the gather-then-sum path (float64) or only move bytes (int64).
    got["sum_f64"] = group.all_reduce(paddle.to_tensor(inputs(rank, (3, 5)).astype(np.float64) / 3)).numpy()
    got["g_i64"] = group.all_gather(paddle.to_tensor(np.arange(6, dtype=np.int64) * (rank + 1)), 0).numpy()
    group.barrier()
    got["group"] = np.array(type(group).__name__)
    np.savez(Path(out) / f"rank{rank}.npz", **got)
    return 0


def launch(backend: str, world: int, port: int, out: Path, ranks=None, timeout_s: float = 30.0, mode="run"):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
    return [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                mode,
                backend,
                str(r),
                str(world),
                str(port),
                str(out),
                str(timeout_s),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (range(world) if ranks is None else ranks)
    ]


def finish(procs, limit_s: float = 90.0) -> list[tuple[int, str]]:
    results = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            pytest.fail(f"a rank hung past {limit_s} s: {err[-2000:]}")
        results.append((p.returncode, err))
    return results


def check_results(world: int, out: Path, group: str) -> None:
    got = [dict(np.load(out / f"rank{r}.npz")) for r in range(world)]
    assert [str(g["group"]) for g in got] == [group] * world
    for shape, _ in CASES:
        key = "x".join(map(str, shape))
        xs = [inputs(r, shape) for r in range(world)]
        ref = rank_order_sum(xs)
        for r in range(world):
            assert got[r][f"sum_{key}"].shape == ref.shape
            assert np.array_equal(got[r][f"sum_{key}"].view(np.uint32), ref.view(np.uint32)), (r, key)
            if shape[0]:
                np.testing.assert_array_equal(got[r][f"g0_{key}"], np.concatenate(xs, axis=0))
                np.testing.assert_array_equal(got[r][f"g1_{key}"], np.concatenate(xs, axis=-1))
    f64 = rank_order_sum([inputs(r, (3, 5)).astype(np.float64) / 3 for r in range(world)])
    i64 = np.concatenate([np.arange(6, dtype=np.int64) * (r + 1) for r in range(world)])
    for r in range(world):
        assert got[r]["sum_f64"].dtype == np.float64 and np.array_equal(got[r]["sum_f64"], f64), r
        np.testing.assert_array_equal(got[r]["g_i64"], i64)


# name -> (backend, world size, ranks launched (None: all), timeout_s, mode). The runs are independent
# (each its own port and directory), so the `runs` fixture starts them all at once: most of their time
# is spent importing Paddle or waiting out a timeout. Generous join timeouts for the runs that must
# succeed: a dozen processes import Paddle at once on a small machine.
SCENARIOS = {
    **{f"{b}-{w}": (b, w, None, 120.0, "run") for b, w in [("shm", 2), ("shm", 3), ("shm-small", 3)]},
    **{f"{b}-{w}": (b, w, None, 120.0, "run") for b, w in [("gloo", 2), ("gloo", 3)]},
    **{f"missing-{b}": (b, 3, [0, 2], 5.0, "run") for b in ("shm", "gloo")},
    **{f"no-master-{b}": (b, 2, [1], 3.0, "run") for b in ("shm", "gloo")},
    **{f"die-{b}": (b, 2, None, 120.0, "die") for b in ("shm", "gloo")},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (port, output directory, [(returncode, stderr) per launched rank]); "after-stale" is a
    2-rank shm run on the port whose segment a SIGKILLed rank 0 ("stale") left behind."""
    started = {}
    # Another service's listener, which never accepts: rank 0 told to listen on its port, and a rank 1
    # told to meet rank 0 there. Bound before the other ports are picked, so none of them is its port.
    busy = socket.socket()
    busy.bind((HOST, 0))
    busy.listen()
    busy_port = busy.getsockname()[1]
    ports = iter(free_ports(len(SCENARIOS) + 2))
    stale_port, stale_dir = next(ports), tmp_path_factory.mktemp("stale")
    stale = finish(launch("shm", 2, stale_port, stale_dir, ranks=[0], mode="stale"))
    stale_left = segment_path(stale_port).exists()
    for name, (backend, world, ranks, timeout_s, mode) in SCENARIOS.items():
        port, out = next(ports), tmp_path_factory.mktemp(name)
        started[name] = (port, out, launch(backend, world, port, out, ranks, timeout_s, mode))
    started["after-stale"] = (stale_port, stale_dir, launch("shm", 2, stale_port, stale_dir, timeout_s=120))
    for name, rank in [("port-busy", 0), ("not-a-store", 1)]:
        out = tmp_path_factory.mktemp(name)
        started[name] = (busy_port, out, launch("gloo", 2, busy_port, out, ranks=[rank], timeout_s=5))
    port, out = next(ports), tmp_path_factory.mktemp("world")  # rank 1 counts 3 ranks, rank 0 two
    procs = launch("gloo", 2, port, out, ranks=[0], timeout_s=5) + launch("gloo", 3, port, out, [1], 5)
    started["wrong-world"] = (port, out, procs)
    done = {name: (port, out, finish(procs, limit_s=240)) for name, (port, out, procs) in started.items()}
    done["stale"] = (stale_port, stale_dir, stale + [(int(stale_left), "")])
    busy.close()
    return done


def test_other_summation_orders_give_other_bits():
    """The bit-equality assertions below can fail: a sum in another order differs from rank order."""
    xs = [inputs(r, (16, 576)) for r in range(3)]
    assert not np.array_equal(rank_order_sum(xs), rank_order_sum(xs[::-1]))


@pytest.mark.parametrize("name", ["shm-2", "shm-3", "shm-small-3", "gloo-2", "gloo-3"])
def test_collectives_match_numpy(runs, name):
    _, out, results = runs[name]
    for rc, err in results:
        assert rc == 0, err[-3000:]
    check_results(len(results), out, "GlooGroup" if name.startswith("gloo") else "ShmGroup")


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1] if err.strip() else ""


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_missing_rank_is_named_within_the_timeout(runs, backend):
    port, _, results = runs[f"missing-{backend}"]
    for rc, err in results:
        assert rc == 3, err[-3000:]
        line = last_line(err)
        assert "rank 1 (node " in line and f"{HOST}:{port}" in line and "did not join" in line, line


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_missing_master_is_named_within_the_timeout(runs, backend):
    port, _, [(rc, err)] = runs[f"no-master-{backend}"]
    assert rc == 3, err[-3000:]
    line = last_line(err)
    assert "rank 0 (node 0)" in line and f"{HOST}:{port}" in line, line


def test_a_taken_master_port_is_a_clear_error(runs):
    """Paddle's store would abort the process (SIGABRT) on a taken port."""
    port, _, [(rc, err)] = runs["port-busy"]
    assert rc == 3, err[-3000:]
    assert f"cannot listen at {HOST}:{port}: port {port} is in use" in last_line(err), last_line(err)


def test_a_master_port_held_by_another_service_is_a_clear_error(runs):
    """The listener completes the connect but never speaks the store's protocol: Paddle's store client
    would wait on it forever."""
    port, _, [(rc, err)] = runs["not-a-store"]
    assert rc == 3, err[-3000:]
    line = last_line(err)
    assert f"rank 0 (node 0) did not answer at {HOST}:{port} within the timeout" in line, line


def test_ranks_that_disagree_on_the_world_size_fail_clearly(runs):
    port, _, [(rc0, err0), (rc1, err1)] = runs["wrong-world"]
    assert rc1 == 3 and f"expects 3 ranks, but rank 0 at {HOST}:{port} started a group of 2" in last_line(
        err1
    )
    assert rc0 == 3 and "rank 1 (node 1) did not join" in last_line(err0), last_line(err0)


def segment_path(port: int) -> Path:
    from fdcli_engine.distributed.shm import segment_name

    return Path("/dev/shm") / segment_name(HOST, port).lstrip("/")


def test_stale_segment_of_a_killed_group_does_not_break_the_next(runs):
    port, _, [(rc, err), (stale_left, _)] = runs["stale"]
    assert rc == -signal.SIGKILL and stale_left, err[-3000:]
    _, out, results = runs["after-stale"]
    for rc, err in results:
        assert rc == 0, err[-3000:]
    check_results(2, out, "ShmGroup")
    assert not segment_path(port).exists()  # unlinked as soon as every rank had attached


# What the survivor's one error line says: shm names the dead rank; gloo only knows its peer hung up.
DEATH = {"shm": "all_reduce: rank 1 exited", "gloo": "all_reduce over gloo failed (a rank died or left"}


@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_a_rank_that_dies_fails_the_others_cleanly(runs, backend):
    _, _, [(rc0, err0), (rc1, _)] = runs[f"die-{backend}"]
    assert rc1 == -signal.SIGKILL
    assert rc0 == 3, err0[-3000:]
    assert DEATH[backend] in last_line(err0), last_line(err0)


@pytest.mark.parametrize(
    "args, message",
    [
        ((2, 2, HOST, 29500, 2, 5), "rank 2 is outside 0..1"),
        ((0, 0, HOST, 29500, 1, 5), "world size must be at least 1"),
        ((0, 2, HOST, 0, 2, 5), "master port 0 is not a TCP port"),
        ((0, 2, HOST, 29500, 0, 5), "ranks per node must be at least 1"),
        ((0, 2, HOST, 29500, 2, 0), "timeout must be positive"),
        ((0, 2, HOST, 29500, 2, 5, "nccl"), "unknown collective backend 'nccl'"),
        ((0, 4, HOST, 29500, 2, 5, "shm"), "need every rank on one host (4 ranks, 2 per node)"),
    ],
)
def test_bad_arguments_are_one_line_config_errors(args, message):
    from fdcli_engine.distributed import SingleRank, init_tp_group
    from fdcli_engine.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        init_tp_group(*args)
    assert isinstance(init_tp_group(0, 1, HOST, 29500, 1, 5), SingleRank)


if __name__ == "__main__":
    md, be, rk, ws, pt, od, to = sys.argv[1:8]
    sys.exit(worker(md, be, int(rk), int(ws), int(pt), od, float(to)))
