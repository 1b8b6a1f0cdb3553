"""`fd run-batch --distributed-executor-backend ray`: the batch's lines over Ray actors, one engine each.

    fd run-batch -i in.jsonl -o out.jsonl --distributed-executor-backend ray [--ray-address HOST:PORT]

Order of work: the config is resolved here first (a bad option or a missing model fails before Ray
starts), then Ray is joined (`--ray-address`) or a local instance is started, the actors are placed
and load the model, and the lines run through the batch dispatcher with the actor pool (ray_pool.py)
in place of a local engine; the output file, --resume and the summary are the single-process run's.

Ray is an optional extra (`pip install 'fd-llm[ray]'`), imported only here and only when asked for.
How many actors: `--data-parallel-size` when given; otherwise as many as the cluster's CPUs fit at
`--threads` CPUs per actor (default: the CPUs of the smallest node, one engine per machine).
Every node needs fd and the model at the same path: each actor loads the model itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from fdcli_engine.entrypoints.batch.dispatcher import BatchRunError
from fdcli_engine.entrypoints.batch.ray_actor import BatchEngineActor
from fdcli_engine.entrypoints.batch.ray_pool import RayActor, RayActorPool, RayDispatcher
from fdcli_engine.entrypoints.batch.sigterm import SigtermStop, keep_sigterm_handler
from fdcli_engine.entrypoints.batch.summary import BatchSummary
from fdcli_engine.errors import ConfigError

RAY_MISSING = "Ray is not installed: pip install 'fd-llm[ray]'"
START_TIMEOUT_ENV = "FD_RAY_ACTOR_START_TIMEOUT"  # seconds for every actor to be placed and load the model
DEFAULT_START_TIMEOUT = 600.0


def import_ray():
    """The `ray` module, or ConfigError with the one line that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def _resolve(engine_args: dict):
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.config_resolver import resolve_config
    from fdcli_engine.entrypoints.openai.serving_options import default_served_name
    from fdcli_engine.threads import import_paddle

    keep_sigterm_handler(import_paddle)  # resolve_config() would import it, with paddle's handler
    config = resolve_config(EngineConfig.from_dict(engine_args, source="options"))
    return config, config.served_model_name or default_served_name(config)


def _connect(ray, address: str | None) -> None:
    """Join the cluster at `address`, or start a local instance on this machine's CPUs; quietly: the
    actors' logs stay in Ray's log folder (stdout may be the batch output, `-o -`)."""
    from fdcli_engine.threads import usable_cpu_count

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    local = {} if address else {"num_cpus": usable_cpu_count()}
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
            **local,
        )
    except Exception as e:  # ConnectionError, a timeout, a version mismatch: one line
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        # Ray tells a refused token only in its C++ log lines: name the likely cause with the error.
        hint = " (a cluster with token authentication needs RAY_AUTH_MODE=token here)" if address else ""
        raise BatchRunError(f"cannot start or join {where}: {' '.join(str(e).split())[:300]}{hint}") from None


def plan_actors(node_cpus: list[int], threads: int | None, num_actors: int | None) -> tuple[int, int]:
    """(CPUs per actor, number of actors) for a cluster whose live nodes have `node_cpus` CPUs."""
    node_cpus = [c for c in node_cpus if c > 0]
    total = sum(node_cpus)
    if not node_cpus:
        raise ConfigError("the Ray cluster has no CPUs to run an engine on")
    if threads is None:
        threads = max(1, total // num_actors) if num_actors else min(node_cpus)
    if num_actors is None:
        num_actors = sum(c // threads for c in node_cpus)
    if num_actors < 1 or num_actors * threads > total or threads > max(node_cpus):
        raise ConfigError(
            f"{max(num_actors, 1)} Ray actor(s) of {threads} CPU(s) each (--data-parallel-size, --threads) do "
            f"not fit the Ray cluster: {total} CPU(s), at most {max(node_cpus)} on one node"
        )
    return threads, num_actors


def _first_error_line(e: BaseException) -> str:
    """The cause of a failed actor start: the last line of Ray's report (the exception raised)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return (lines[-1] if lines else type(e).__name__)[:300]


async def _start_actors(ray, config, name: str, serving, threads: int, count: int) -> list[RayActor]:
    """Place `count` actors and wait until every one has loaded the model (BatchRunError otherwise)."""
    remote_cls = ray.remote(BatchEngineActor)
    serving_json = json.dumps(dataclasses.asdict(serving))
    handles = [
        remote_cls.options(num_cpus=threads, max_restarts=0).remote(
            config.to_json(), name, serving_json, threads
        )
        for _ in range(count)
    ]
    timeout = float(os.environ.get(START_TIMEOUT_ENV) or DEFAULT_START_TIMEOUT)
    waits = [asyncio.ensure_future(_await(h.where.remote())) for h in handles]
    done, pending = await asyncio.wait(waits, timeout=timeout)
    for w in pending:
        w.cancel()
    failed = [w for w in done if w.exception() is not None]
    if failed or pending:
        for h in handles:
            ray.kill(h, no_restart=True)
        if failed:
            raise BatchRunError(f"a Ray actor failed to start: {_first_error_line(failed[0].exception())}")
        raise BatchRunError(
            f"{len(pending)} of {count} Ray actor(s) did not start within {timeout:.0f} s ({START_TIMEOUT_ENV}): "
            f"each needs {threads} CPU(s) on one node and the model at {config.model_path}"
        )
    actors = []
    for i, (h, w) in enumerate(zip(handles, waits)):
        info = w.result()
        actors.append(RayActor(i, h, int(info["pid"]), str(info["host"])))
        sys.stderr.write(
            f"fd run-batch: Ray actor {i} ready: pid {info['pid']} on {info['host']} ({threads} CPU(s))\n"
        )
    return actors


async def _await(ref):
    return await ref


async def run_on_ray(
    opts, engine_args: dict, path: Path, num_lines: int, done_keys: dict, stop: SigtermStop
) -> BatchSummary:
    from fdcli_engine.entrypoints.batch import run_dispatcher

    stop.watch()
    config, name = _resolve(engine_args)
    ray = import_ray()
    _connect(ray, config.ray_address)
    stop.install()  # Ray's start-up may have replaced the SIGTERM handler
    actors: list[RayActor] = []
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        threads, count = plan_actors(
            [int(n.get("Resources", {}).get("CPU", 0)) for n in nodes],
            config.threads,
            engine_args.get("data_parallel_size"),
        )
        actors = await _start_actors(ray, config, name, opts.serving, threads, count)
        window = opts.max_inflight or 2 * int(config.max_num_seqs or 32) * count
        pool = RayActorPool(actors, chunk=window // (2 * count), kill=ray.kill)
        pool.start()

        def make(writer, progress):
            return RayDispatcher(
                pool, writer, window, done_keys=done_keys, strict=opts.strict, progress=progress
            )

        try:
            return await run_dispatcher(opts, path, num_lines, make)
        finally:
            await pool.close()
            sys.stderr.write(pool.report() + "\n")
    finally:
        for a in actors:  # an actor's engine is in its process: killing it frees the engine and its CPUs
            try:
                ray.kill(a.handle, no_restart=True)
            except Exception:
                pass
        ray.shutdown()
        stop.install()  # ray.shutdown() puts back the default SIGTERM disposition
