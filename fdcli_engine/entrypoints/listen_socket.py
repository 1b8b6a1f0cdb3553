"""The listening socket of an fd server (`fd serve`, its metrics port, `fd router`), bound before the
server starts so that a taken port is one line naming the flag to change, not a traceback."""

from __future__ import annotations

import socket

from fdcli_engine.errors import ConfigError


def bind_socket(host: str, port: int, flag: str = "--port") -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        reason = "is already in use" if e.errno in (98, 48) else f"cannot be bound ({e.strerror})"
        raise ConfigError(f"{host}:{port} {reason}; pick another {flag}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
