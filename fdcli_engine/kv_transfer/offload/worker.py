"""One daemon thread that handles queued items in order, for the offload tiers' disk work (the file
tier's writes, the prefetcher's reads): the engine thread only queues, never waits for the disk."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class QueueWorker:
    def __init__(self, handle: Callable[[object], None], name: str):
        self._handle = handle
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item) -> None:
        self._queue.put(item)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:  # close()
                    return
                self._handle(item)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every item queued so far is handled."""
        self._queue.join()

    def close(self) -> None:
        """Handle what is queued, then stop the thread (bounded wait)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)
