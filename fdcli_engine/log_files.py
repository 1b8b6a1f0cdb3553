"""Process logging: stderr always, and FastDeploy's `FD_LOG_DIR` log files when it is set.

FastDeploy writes its logs into `FD_LOG_DIR` (default ./log), one file per component; fd writes the
two that map onto its processes, and only when the variable is set (a server started without it
leaves no files behind):
- `api_server.log`: the HTTP server process (options, start-up, the console lines it prints);
- `workerlog.0`: the engine-core process (model load, kernels, engine errors), FastDeploy's per-device
  worker log for device 0.
Every record still goes to stderr as well. Leaf module: the stdlib only.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fdcli_engine.errors import ConfigError

LOG_DIR_ENV = "FD_LOG_DIR"
SERVER_LOG = "api_server.log"
CORE_LOG = "workerlog.0"
# The lines a process prints for the user (not through logging); with FD_LOG_DIR set they are also
# written to its log file, without repeating them on stderr.
CONSOLE_LOGGER = "fd.console"


def quiet_http_client() -> None:
    """httpx logs every request at INFO; a heartbeat (POST /register every second) or a proxied call
    would be a log line each. Its warnings still go out."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def configure_logging(fmt: str, file_name: str) -> Path | None:
    """INFO and above to stderr, plus FD_LOG_DIR/`file_name` when FD_LOG_DIR is set (returned)."""
    logging.basicConfig(level=logging.INFO, format=fmt)
    quiet_http_client()
    root, console = logging.getLogger(), logging.getLogger(CONSOLE_LOGGER)
    console.propagate = False  # printed already; only the file gets them
    for logger in (root, console):  # a second call (tests start servers in-process) replaces the first
        for handler in [h for h in logger.handlers if getattr(h, "_fd_log_file", False)]:
            logger.removeHandler(handler)
            handler.close()
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return None
    path = Path(log_dir).expanduser() / file_name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{LOG_DIR_ENV}={log_dir!r}: cannot write {path}: {exc.strerror or exc}") from None
    handler._fd_log_file = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    console.addHandler(handler)
    console.setLevel(logging.INFO)
    return path
