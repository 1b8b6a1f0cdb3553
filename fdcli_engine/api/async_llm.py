"""AsyncLLM: the server's engine client, the front end over engine cores in their own processes.

The front end (front_end.py) does the request bookkeeping and output processing; this class is its
transport: requests and aborts go to the engine-core processes over ZMQ (core_client.py), and the
cores' events (outputs, failed requests, readiness, utility replies, a fatal start, heartbeats) come back
on the event loop.

Data parallelism (--data-parallel-size N): N engine cores (dp_rank.py), each request on exactly one of
them, chosen by DPRouter (least loaded, preferring the rank holding the prompt's prefix); a request's
aborts go to its rank. A core that dies before every rank is ready, or the last live one, kills the
engine (EngineFrontEnd._on_dead: every waiting request fails, new ones are refused). After start, one
rank's death fails only its own requests and calls with EngineDeadError (503); the other ranks keep
serving, the dead one gets nothing more, and `dead_ranks` names it (/health reports it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from functools import partial

from fdcli_engine.api.core_client import DEFAULT_CORE, CoreClient
from fdcli_engine.api.core_messages import (
    AbortRequest,
    FatalMsg,
    OutputsMsg,
    ReadyMsg,
    RequestFailed,
    UtilityReply,
    UtilityRequest,
)
from fdcli_engine.api.dp_rank import CoreRank, rank_configs
from fdcli_engine.api.dp_router import DPRouter
from fdcli_engine.api.dp_stats import merge_rank_stats
from fdcli_engine.api.front_end import EngineFrontEnd, model_config_of
from fdcli_engine.api.protocol import EngineDeadError, EngineNotReadyError, EngineRequestError, ModelConfig
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.outputs import RequestOutput
from fdcli_engine.request import EngineCoreRequest
from fdcli_engine.resolved_config import ResolvedConfig

__all__ = ["AsyncLLM", "EngineDeadError", "EngineNotReadyError", "EngineRequestError", "ModelConfig"]
logger = logging.getLogger("fd.serve")


class AsyncLLM(EngineFrontEnd):
    def __init__(
        self,
        config: ResolvedConfig,
        tokenizer,
        served_model_name: str | None = None,
        output_processor_cls=None,
        core_spec: str = DEFAULT_CORE,
        core_stdout: int | None = None,
    ):
        if output_processor_cls is None:
            from fdcli_engine.output_processor import OutputProcessor as output_processor_cls
        processor = output_processor_cls(tokenizer)
        super().__init__(config, tokenizer, model_config_of(config, served_model_name), processor)
        self._pending_calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._rank_of: dict[str, int] = {}  # request id -> its rank, until it finishes
        self.ranks: list[CoreRank] = []
        for r, cfg in enumerate(rank_configs(config)):
            client = CoreClient(
                cfg,
                partial(self._on_rank_event, r),
                partial(self._on_rank_dead, r),
                core_spec,
                core_stdout,
                busy=partial(self._waits_on_rank, r),
            )
            self.ranks.append(CoreRank(r, client))
        self.router = DPRouter(
            len(self.ranks), config.block_size, config.enable_prefix_caching, config.num_kv_blocks
        )

    @property
    def client(self) -> CoreClient:
        """Rank 0's core client (the only one without data parallelism; tests put a stub in its place)."""
        return self.ranks[0].client

    @client.setter
    def client(self, client) -> None:
        self.ranks[0].client = client

    def _on_event(self, event) -> None:
        """An event from rank 0's core (the only one without data parallelism)."""
        self._on_rank_event(0, event)

    @property
    def dead_ranks(self) -> dict[int, str]:
        return {r.index: r.dead_reason for r in self.ranks if r.dead_reason is not None}

    async def start(self) -> None:
        for rank in self.ranks:
            rank.client.start()

    def _waits_on_rank(self, r: int) -> bool:
        """Requests or calls in rank r's core, once loaded (loading a model is not stepping)."""
        rank = self.ranks[r]
        return self.is_ready and bool(rank.req_ids or rank.call_ids)

    # ---- the transport ----
    def _submit(self, req: EngineCoreRequest) -> None:
        if len(self.ranks) == 1:
            r = 0
        else:
            hashes = self.router.block_hashes(req.prompt_token_ids, req.params, req.mm_features)
            loads = [len(k.req_ids) if k.live else None for k in self.ranks]
            r = self.router.pick(hashes, loads, len(req.prompt_token_ids))
            self.router.record(r, hashes)
        self._rank_of[req.req_id] = r
        self.ranks[r].req_ids.add(req.req_id)
        self.ranks[r].client.send(req)

    def _abort_in_core(self, req_ids: list[str]) -> None:
        """Each id to its rank; an id already finished here (a stop string matched) may still run in
        its core: it goes to every live rank (a core ignores ids it does not hold)."""
        by_rank: dict[int, list[str]] = {}
        for req_id in req_ids:
            r = self._rank_of.get(req_id)
            for k in [r] if r is not None else range(len(self.ranks)):
                by_rank.setdefault(k, []).append(req_id)
            if req_id not in self._collectors:
                self._release(req_id)
        for r, ids in by_rank.items():
            if self.ranks[r].live:
                self.ranks[r].client.send(AbortRequest(ids))

    def _release(self, req_id: str) -> None:
        r = self._rank_of.pop(req_id, None)
        if r is not None:
            self.ranks[r].req_ids.discard(req_id)

    def _put(self, req_id: str, item: RequestOutput | BaseException) -> None:
        super()._put(req_id, item)
        if req_id not in self._collectors:
            self._release(req_id)

    # ---- events from the cores (run on the event loop, must not block) ----
    def _on_rank_event(self, r: int, event) -> None:
        if isinstance(event, OutputsMsg):
            self._route_outputs(event.outputs)
        elif isinstance(event, RequestFailed):
            err: Exception = (
                InvalidRequestError(event.message, event.param)
                if event.status == 400
                else EngineRequestError(event.message)
            )
            self._fail_request(event.req_id, err)
        elif isinstance(event, UtilityReply):
            self.ranks[r].call_ids.discard(event.call_id)
            fut = self._pending_calls.pop(event.call_id, None)
            if fut and not fut.done():
                fut.set_result(event)
        elif isinstance(event, ReadyMsg):
            self._on_rank_ready(r, event)
        elif isinstance(event, FatalMsg):
            what = "failed" if self.ranks[r].ready else "failed to start"
            self._on_rank_dead(r, f"the engine core {what}: {event.message}")

    def _on_rank_ready(self, r: int, event: ReadyMsg) -> None:
        self.ranks[r].ready = True
        if event.max_model_len:
            self.model_config.max_model_len = event.max_model_len
        self.model_config.vocab_size = event.vocab_size
        if all(k.ready for k in self.ranks) and not self.is_dead:
            self._mark_ready()

    def _on_rank_dead(self, r: int, reason: str) -> None:
        rank = self.ranks[r]
        if rank.dead_reason is not None or self.is_dead:
            return
        if len(self.ranks) > 1:
            reason = f"data-parallel rank {r}: {reason}"
        rank.dead_reason = reason
        self.router.forget(r)
        if not self.was_ready or not any(k.live for k in self.ranks):
            self._on_dead(reason)
            return
        logger.error("%s; %d request(s) on it fail, the other ranks go on", reason, len(rank.req_ids))
        for req_id in list(rank.req_ids):
            self.output_processor.abort(req_id)
            self._put(req_id, EngineDeadError(reason))
        self._fail_calls(rank.call_ids, reason)

    def _fail_calls(self, call_ids, reason: str) -> None:
        for call_id in list(call_ids):
            fut = self._pending_calls.pop(call_id, None)
            if fut and not fut.done():
                fut.set_exception(EngineDeadError(reason))
        call_ids.clear()

    def _on_dead(self, reason: str) -> None:
        super()._on_dead(reason)
        self._fail_calls(list(self._pending_calls), reason)
        for rank in self.ranks:
            rank.call_ids.clear()

    async def _call(self, rank: CoreRank, method: str, timeout: float) -> dict:
        call_id = next(self._call_ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending_calls[call_id] = fut
        rank.call_ids.add(call_id)
        rank.client.send(UtilityRequest(call_id, method))
        try:
            reply = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending_calls.pop(call_id, None)
            rank.call_ids.discard(call_id)
        if reply.error:
            raise EngineRequestError(reply.error)
        return dict(reply.result or {})

    async def get_stats(self, timeout: float = 5.0) -> dict:
        """One rank: its core's stats. Several: the sums (dp_stats.py) with each rank's under "ranks"."""
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        if len(self.ranks) == 1:
            return await self._call(self.ranks[0], "get_stats", timeout)
        live = [k for k in self.ranks if k.live]
        replies = await asyncio.gather(
            *(self._call(k, "get_stats", timeout) for k in live), return_exceptions=True
        )
        for rank, reply in zip(live, replies):
            if isinstance(reply, dict):
                rank.last_stats = reply
        return merge_rank_stats(
            [k.last_stats if k.live else None for k in self.ranks], [k.last_stats for k in self.ranks]
        )

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the cores: Shutdown, up to `timeout` s to leave, then terminate/kill; then reap them."""
        await asyncio.gather(*(k.client.shutdown(timeout) for k in self.ranks))
