"""SIGTERM for `fd run-batch`: stop the run the way Ctrl-C does, whatever SIGINT's disposition.

A job started in the background from a script inherits SIGINT ignored (POSIX shells do that so a
Ctrl-C at the terminal spares background jobs), and then neither Python nor `asyncio.run` installs a
SIGINT handler. So SIGTERM must not be routed through SIGINT: inside the run it cancels the main task
itself (what asyncio's own SIGINT handler does), so the partial output and the summary are written and
the core is stopped; the caller then turns the cancellation into KeyboardInterrupt (the CLI's exit
130). Before the task exists, and on a second signal, it raises KeyboardInterrupt at once.
"""

from __future__ import annotations

import asyncio
import signal
import threading


class SigtermStop:
    """The SIGTERM handler of one run (install it, then call `watch()` inside the main task)."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, _signum=None, _frame=None) -> None:
        self.count += 1
        task = self._task
        if self.count == 1 and task is not None and not task.done():
            task.cancel()
            self._loop.call_soon_threadsafe(lambda: None)  # wake the loop if it waits in select()
            return
        raise KeyboardInterrupt

    def watch(self) -> None:
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()

    def install(self):
        """Become SIGTERM's handler (main thread only); returns the handler replaced, or None."""
        if threading.current_thread() is not threading.main_thread():
            return None
        return signal.signal(signal.SIGTERM, self)


def keep_sigterm_handler(fn) -> None:
    """Run `fn` (importing paddle) with SIGTERM held (blocked) in this thread, then put back the
    handler that was there: paddle installs its own, which prints a C++ FatalError report and kills the
    process between two writes. A SIGTERM that arrived meanwhile is then handled by ours."""
    if threading.current_thread() is not threading.main_thread():
        fn()
        return
    handler = signal.getsignal(signal.SIGTERM)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        fn()
        signal.signal(signal.SIGTERM, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
