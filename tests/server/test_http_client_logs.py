"""The processes' logging drops httpx's one INFO line per request: an instance behind `fd router`
POSTs /register every second, which would otherwise log a line a second for as long as it runs."""

from __future__ import annotations

import logging

import httpx

from fdcli_engine.log_files import configure_logging


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_httpx_requests_are_not_logged(monkeypatch):
    monkeypatch.delenv("FD_LOG_DIR", raising=False)
    root = logging.getLogger()
    records = _Records()
    old_level, old_httpx = root.level, logging.getLogger("httpx").level
    root.addHandler(records)
    try:
        configure_logging("%(message)s", "api_server.log")
        root.setLevel(logging.INFO)  # what configure_logging sets on a fresh process
        with httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200))) as client:
            assert client.post("http://router.test/register", json={}).status_code == 200
        logging.getLogger("fd").info("engine ready")
    finally:
        root.removeHandler(records)
        root.setLevel(old_level)
        logging.getLogger("httpx").setLevel(old_httpx)
    assert "engine ready" in records.messages  # fd's own INFO lines still go out
    assert not [m for m in records.messages if m.startswith("HTTP Request")], records.messages
