"""The asyncio event loop fd's processes run on: uvloop's when it is installed (a dependency except on
Windows), else asyncio's. Its callbacks, timers and socket writes cost less CPU per streamed token, which
matters twice on a small machine: in `fd serve`'s front end, and in `fd bench serve`'s client, which shares
the cores with the server it measures."""

from __future__ import annotations

import asyncio


def event_loop_runner() -> asyncio.Runner:
    """An asyncio.Runner on uvloop's loop when it imports, else on asyncio's (same semantics as
    asyncio.run, Ctrl-C included)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)
