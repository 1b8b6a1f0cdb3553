"""vLLM's --enable-request-id-headers: every response carries an X-Request-Id header, the client's own
when its request sent one, else a fresh random id. A plain ASGI middleware: it touches only the
response head, so a stream's chunks pass through it untouched."""

from __future__ import annotations

import uuid

HEADER = b"x-request-id"
_MAX_LEN = 256  # a client's id longer than this is replaced, not echoed


class RequestIdHeader:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope.get("headers", ()) if k == HEADER), b"")
        rid = given if 0 < len(given) <= _MAX_LEN else uuid.uuid4().hex.encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
