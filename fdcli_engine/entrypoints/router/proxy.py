"""One OpenAI request through a prefill and a decode instance.

The decode instance D is picked first (its KV address goes to the prefill side), then a prefill
instance P gets the body with `max_tokens: 1`, no stream, and `kv_transfer_params` naming the transfer
and D's address; once P has answered (its blocks are on their way), D gets the original body with
`kv_transfer_params` naming the same transfer, and D's answer (or stream) is relayed to the client.

Without a prefill/decode pair, a registered mixed instance serves the whole request. With
`max_local_prefill_length` > 0, a prompt counted at most that many tokens goes to D alone, which
prefills it itself (local_prefill.py).

Faults: a P that cannot be reached or fails gives the request to the next P (503 when none is left);
a D that cannot be reached is forgotten and the request starts over with another D; a D that dies
mid-answer ends the client's stream with an error event (or a 502 error object) at once. Every wait is
watched: an instance forgotten by the registry (no heartbeat) ends the wait, and so does a client that
hangs up (its instances' requests are closed, so they abort as when a client leaves fd serve itself;
a stream's relay is cancelled by the server on the client's disconnect).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextvars import ContextVar

import httpx
from starlette.responses import Response, StreamingResponse

from fdcli_engine.entrypoints.openai.errors import APIError
from fdcli_engine.entrypoints.router.local_prefill import prompt_tokens
from fdcli_engine.entrypoints.router.registry import Instance, Registry

logger = logging.getLogger("fd.router")

MAX_DECODE_TRIES = 3
WATCH_S = 0.5
FORWARDED_HEADERS = ("authorization", "x-api-key")
# Fields a prefill-only pass must not carry: it samples one token, unstreamed.
_PREFILL_DROPS = ("max_completion_tokens", "stream_options", "min_tokens")


class _Gone(Exception):
    """The instance was forgotten (no heartbeat) while the router waited on it."""


class _ClientGone(Exception):
    """The client hung up while the router waited on an instance."""


# The current request's disconnect check (Request.is_disconnected), read by every wait of handle().
_client_gone: ContextVar[Callable[[], Awaitable[bool]] | None] = ContextVar("client_gone", default=None)


def error_response(status: int, message: str, code: str | None = None) -> Response:
    body = APIError(message, status, code=code).to_dict()
    return Response(json.dumps(body), status, media_type="application/json")


def forwarded(headers) -> dict:
    return {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}


class PDProxy:
    def __init__(self, registry: Registry, client: httpx.AsyncClient, max_local_prefill_length: int = 0):
        self.registry = registry
        self.client = client
        self.max_local_prefill_length = max_local_prefill_length
        self.local_prefills = 0  # requests D prefilled itself (fd:router_local_prefill_total)

    async def handle(
        self, path: str, body: dict, headers: dict, client_gone: Callable[[], Awaitable[bool]] | None = None
    ) -> Response:
        token = _client_gone.set(client_gone)
        try:
            return await self._handle(path, body, headers)
        except _ClientGone:
            logger.info("client left %s: its instances' requests closed", path)
            return error_response(499, "the client closed the request")
        finally:
            _client_gone.reset(token)

    async def _handle(self, path: str, body: dict, headers: dict) -> Response:
        if not (self.registry.live("prefill") and self.registry.live("decode")):
            mixed = self.registry.pick("mixed")
            if mixed is not None:  # no prefill/decode pair: a mixed instance serves the whole request
                try:
                    return await self._decode(path, body, headers, mixed, None)
                except (httpx.ConnectError, httpx.ConnectTimeout, _Gone):
                    self.registry.forget(mixed)
                    return error_response(503, f"the mixed instance {mixed.url} is unreachable")
        failed: set[str] = set()
        for _ in range(MAX_DECODE_TRIES):
            d = self.registry.pick("decode", failed)
            if d is None:
                break
            try:
                return await self._through(path, body, headers, d)
            except (httpx.ConnectError, httpx.ConnectTimeout, _Gone):
                logger.warning("decode instance %s unreachable: forgotten", d.url)
                self.registry.forget(d)
                failed.add(d.url)
        return error_response(503, "no decode instance is available (none registered with the router)")

    async def _through(self, path, body, headers, d: Instance) -> Response:
        """The request served by D: prefilled by D itself when the prompt is short enough, else by a
        prefill instance first. Raises what reaching D raises (_prefill handles its own instances' faults)."""
        if await self._local(path, body, headers, d):
            answer = await self._decode(path, body, headers, d, None)
            self.local_prefills += 1  # counted once D has taken the request
            return answer
        tid = f"pd-{uuid.uuid4().hex}"
        refused = await self._prefill(path, body, headers, d, tid)
        if refused is not None:
            return refused
        return await self._decode(path, body, headers, d, tid)

    async def _local(self, path, body, headers, d: Instance) -> bool:
        """Whether D prefills the prompt itself: counted at most max_local_prefill_length tokens."""
        limit = self.max_local_prefill_length
        if limit <= 0:
            return False
        n = await self._watched(d, prompt_tokens(self.client, d.url, path, body, headers, limit))
        return n is not None and n <= limit

    async def _watched(self, inst: Instance, aw):
        """`aw`'s result, or _Gone as soon as the registry forgets `inst`."""
        task = asyncio.ensure_future(aw)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_S)
                if done:
                    return task.result()
                if not self.registry.is_alive(inst):
                    raise _Gone(inst.url)
                client_gone = _client_gone.get()
                if client_gone is not None and await client_gone():
                    raise _ClientGone
        finally:
            if not task.done():
                task.cancel()

    async def _prefill(self, path, body, headers, d: Instance, tid: str) -> Response | None:
        """None once a prefill instance has computed the prompt; else the response for the client."""
        p_body = {k: v for k, v in body.items() if k not in _PREFILL_DROPS}
        p_body.update(max_tokens=1, stream=False)
        p_body["kv_transfer_params"] = {
            "do_remote_decode": True,
            "transfer_id": tid,
            "remote_kv_address": d.kv_address,
        }
        tried: set[str] = set()
        while (p := self.registry.pick("prefill", tried)) is not None:
            tried.add(p.url)
            p.in_flight += 1
            try:
                r = await self._watched(p, self.client.post(p.url + path, json=p_body, headers=headers))
            except (httpx.TransportError, _Gone) as e:
                logger.warning("prefill instance %s failed (%s): forgotten", p.url, type(e).__name__)
                self.registry.forget(p)
                continue
            finally:
                p.in_flight -= 1
            if r.status_code == 200:
                return None
            if r.status_code >= 500:
                logger.warning("prefill instance %s answered %d: trying another", p.url, r.status_code)
                continue
            return Response(r.content, r.status_code, media_type="application/json")  # the client's error
        return error_response(503, "no prefill instance is available (none registered with the router)")

    async def _decode(self, path, body, headers, d: Instance, tid: str | None) -> Response:
        """D's answer to the body (a mixed instance's, whole, when `tid` is None), relayed."""
        d_body = dict(body)
        if tid is not None:
            d_body["kv_transfer_params"] = {"do_remote_prefill": True, "transfer_id": tid}
        req = self.client.build_request("POST", d.url + path, json=d_body, headers=headers)
        d.in_flight += 1
        try:
            resp = await self._watched(d, self.client.send(req, stream=True))
        except (httpx.ConnectError, httpx.ConnectTimeout, _Gone):
            d.in_flight -= 1
            raise  # never reached, or forgotten: the caller starts over elsewhere
        except httpx.TransportError as e:
            # D took the request and failed before its answer's headers: a non-streamed answer's come at
            # its end, so this is a death mid-request (the prefilled blocks went to D: no start over).
            d.in_flight -= 1
            logger.warning(
                "%s instance %s failed mid-request (%s): forgotten", d.role, d.url, type(e).__name__
            )
            self.registry.forget(d)
            return error_response(502, f"the {d.role} instance {d.url} failed mid-request", "decode_failed")
        except BaseException:
            d.in_flight -= 1
            raise
        if resp.status_code != 200 or not body.get("stream"):
            try:
                content = await self._watched(d, resp.aread())
            except (httpx.TransportError, _Gone):
                self.registry.forget(d)
                return error_response(
                    502, f"the {d.role} instance {d.url} failed mid-request", "decode_failed"
                )
            finally:
                d.in_flight -= 1
                await resp.aclose()
            return Response(content, resp.status_code, media_type=resp.headers.get("content-type"))
        return StreamingResponse(self._relay(d, resp), media_type="text/event-stream")

    async def _relay(self, d: Instance, resp: httpx.Response):
        chunks = resp.aiter_raw()
        at_boundary = True
        try:
            while True:
                try:
                    chunk = await self._watched(d, chunks.__anext__())
                except StopAsyncIteration:
                    return
                at_boundary = chunk.endswith(b"\n\n")
                yield chunk
        except (httpx.TransportError, _Gone) as e:
            logger.warning("decode instance %s failed mid-stream (%s): forgotten", d.url, type(e).__name__)
            self.registry.forget(d)
            err = APIError(f"the decode instance {d.url} failed mid-stream", 502, code="decode_failed")
            yield (
                b"" if at_boundary else b"\n\n"
            ) + f"data: {json.dumps(err.to_dict())}\n\ndata: [DONE]\n\n".encode()
        finally:
            d.in_flight -= 1
            await resp.aclose()
