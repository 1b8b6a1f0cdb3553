"""CoreClient notices an engine-core process that exits: through a process descriptor where the OS has
one (no periodic wake-up of the front end), else by polling. Either way the death is reported once,
with the exit code, and a shutdown() afterwards returns."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from fdcli_engine.api.core_client import WATCH_INTERVAL_S, CoreClient
from fdcli_engine.api.core_messages import FatalMsg
from fdcli_engine.resolved_config import ResolvedConfig

# A core that cannot be built sends FatalMsg and exits with code 1 (core_proc.main).
FAILING_CORE = "fdcli_engine.no_such_module:EngineCore"


async def _run_until_dead(timeout: float = 60.0):
    events, deaths = [], []
    client = CoreClient(ResolvedConfig(), events.append, deaths.append, core_spec=FAILING_CORE, core_stdout=2)
    client.start()
    try:
        deadline = time.monotonic() + timeout
        while not deaths and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(3 * WATCH_INTERVAL_S)  # nothing more may be reported
        return client, events, deaths
    finally:
        await asyncio.wait_for(client.shutdown(), 30)


def _check(client, events, deaths):
    assert deaths == ["the engine core process exited with code 1"]
    assert any(isinstance(e, FatalMsg) and "ModuleNotFoundError" in e.message for e in events)
    assert client._pidfd is None  # the descriptor is closed once the exit is seen
    assert client.proc.poll() == 1


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no process descriptors on this OS")
def test_core_exit_is_seen_through_a_process_descriptor():
    client, events, deaths = asyncio.run(_run_until_dead())
    _check(client, events, deaths)
    assert client._tasks == []  # no polling task was started


def test_core_exit_is_seen_by_polling_without_process_descriptors(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    client, events, deaths = asyncio.run(_run_until_dead())
    _check(client, events, deaths)
    assert len(client._tasks) == 1 and client._tasks[0].done()
