"""The prefill → decode connector (base.py's contract).

Prefill instance: a request whose `kv_transfer_params` say `do_remote_decode` has, when it finishes,
its prompt's full blocks copied out of the pool (`request_finished`, on the engine thread) and sent
by the sender thread to `remote_kv_address` under its `transfer_id`.

Decode instance: a request with `do_remote_prefill` waits (`None` from get_num_new_matched_tokens)
until its transfer is staged, or `timeout_s` has passed, then loads the staged blocks only when the
transfer's token ids equal its prompt; any other outcome recomputes. A staged copy is dropped once
loaded, refused, or its request ends.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from fdcli_engine.kv_transfer.base import KVBlockViews, KVConnector
from fdcli_engine.kv_transfer.pd.messages import part_specs
from fdcli_engine.kv_transfer.pd.params import TransferParams, parse_transfer_params
from fdcli_engine.kv_transfer.pd.settings import PDSettings
from fdcli_engine.kv_transfer.pd.staging import COMPLETE, PENDING, Staging

logger = logging.getLogger(__name__)


class PDConnector(KVConnector):
    def __init__(self, settings: PDSettings):
        self.settings = settings
        self.sender = None
        self.receiver = None
        self.staging: Staging | None = None
        self._waiting_since: dict[str, float] = {}  # decode: req_id -> first asked
        self._load_from: dict[str, int] = {}  # decode: req_id -> first block index to load
        self._recomputing: set[str] = set()  # decode: decided to recompute (asked again: still 0)
        self.num_loaded_blocks = 0
        self.num_recomputed = 0
        self.num_timeouts = 0

    def bind(self, views: KVBlockViews) -> None:
        super().bind(views)
        from fdcli_engine.kv_transfer.pd.receiver import Receiver
        from fdcli_engine.kv_transfer.pd.sender import Sender

        s = self.settings
        if s.role == "prefill":
            self.sender = Sender(s.token, s.timeout_s)
        elif s.role == "decode":
            nbytes = [a[0].nbytes for a in views.arrays]
            self.staging = Staging(s.staging_bytes, part_specs(views.arrays), nbytes, s.timeout_s)
            self.receiver = Receiver(s.address, s.token, self.staging)
            logger.info("KV transfers received on %s", self.receiver.address)

    # ---- decode side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> int | None:
        tp = _params(request, self.settings.role)
        if tp is None or not tp.do_remote_prefill or self.staging is None:
            return 0
        if request.req_id in self._recomputing:
            return 0
        staged = self.staging.get(tp.transfer_id)
        if staged is None or staged.state == PENDING:
            first = self._waiting_since.setdefault(request.req_id, time.monotonic())
            if time.monotonic() - first < self.settings.timeout_s:
                return None
            self.num_timeouts += 1
            logger.warning(
                "KV transfer %s not received in %.0f s: recomputing", tp.transfer_id, self.settings.timeout_s
            )
            return self._recompute(request, tp)
        if staged.state != COMPLETE or staged.prompt_token_ids != list(request.prompt_token_ids):
            return self._recompute(request, tp)
        if getattr(request, "mm_features", None):  # equal placeholder ids say nothing of the pictures
            return self._recompute(request, tp)
        bs = self.views.block_size
        # Whole blocks directly after the pool's hit, leaving at least one prompt token to compute.
        usable = min(staged.num_blocks, (len(request.prompt_token_ids) - 1) // bs)
        start = num_computed_tokens // bs
        if usable <= start:  # the pool's own prefix cache holds all of it: nothing to load
            return self._recompute(request, tp, counted=False)
        self._load_from[request.req_id] = start
        self._waiting_since.pop(request.req_id, None)
        return (usable - start) * bs

    def load(self, request, block_hashes: list[bytes], block_ids: list[int]) -> int:
        tp = _params(request, self.settings.role)
        start = self._load_from.pop(request.req_id, None)
        if tp is None or start is None or self.staging is None:
            return 0
        staged = self.staging.get(tp.transfer_id)
        n = 0
        if staged is not None and staged.state == COMPLETE:
            for i, block_id in enumerate(block_ids):
                if start + i >= len(staged.blocks):
                    break
                self.views.write(block_id, self._parts(staged.blocks[start + i]))
                n += 1
        self.staging.drop(tp.transfer_id)
        self.num_loaded_blocks += n
        return n

    def _parts(self, raw: list[bytes]) -> list[np.ndarray]:
        return [np.frombuffer(b, dtype=a.dtype).reshape(a.shape[1:]) for b, a in zip(raw, self.views.arrays)]

    def _recompute(self, request, tp: TransferParams, counted: bool = True) -> int:
        """Decide, once, that the request computes its prompt itself; its staged copy goes."""
        self.num_recomputed += counted
        self._recomputing.add(request.req_id)
        self._waiting_since.pop(request.req_id, None)
        self.staging.drop(tp.transfer_id)
        return 0

    # ---- both sides ----
    def request_finished(self, request) -> None:
        tp = _params(request, self.settings.role)
        if tp is None:
            return
        status = getattr(request.status, "value", "")
        if tp.do_remote_prefill:
            self._waiting_since.pop(request.req_id, None)
            self._load_from.pop(request.req_id, None)
            if status == "preempted":  # it resumes by recomputing: its transfer is gone
                self._recomputing.add(request.req_id)
            else:
                self._recomputing.discard(request.req_id)
            if self.staging is not None:
                self.staging.drop(tp.transfer_id)
            return
        if self.sender is None or status not in ("stop", "length"):
            return  # preempted (it runs again) or aborted (nobody waits for its answer)
        self._ship(request, tp)

    def _ship(self, request, tp: TransferParams) -> None:
        from fdcli_engine.kv_transfer.pd.sender import Outgoing

        bs = self.views.block_size
        n = min(request.num_computed_tokens, len(request.prompt_token_ids)) // bs
        blocks = [self.views.read(b) for b in request.block_ids[:n]]
        out = Outgoing(
            tp.remote_kv_address, tp.transfer_id, list(request.prompt_token_ids), bs,
            part_specs(self.views.arrays), blocks,
        )  # fmt: skip
        self.sender.submit(out)

    def stats(self) -> dict:
        out = {
            "kv_transfer_loaded_blocks": self.num_loaded_blocks,
            "kv_transfer_recomputed": self.num_recomputed,
            "kv_transfer_timeouts": self.num_timeouts,
        }
        if self.sender is not None:
            out["kv_transfer_sent"] = self.sender.num_sent
            out["kv_transfer_send_failures"] = self.sender.num_failed
            out["kv_transfer_sent_bytes"] = self.sender.num_bytes
        if self.staging is not None:
            out["kv_transfer_staged_bytes"] = self.staging.nbytes
            out["kv_transfer_refused"] = self.staging.num_refused
        return out

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        if self.receiver is not None:
            self.receiver.close()


def _params(request, role: str) -> TransferParams | None:
    """The request's transfer; a malformed one was refused at admission (EngineCore.validate_request)."""
    try:
        return parse_transfer_params(getattr(request, "kv_transfer_params", None), role)
    except Exception:  # noqa: BLE001 - never fail the engine thread over a request's field
        return None


def make_pd_connector(config) -> PDConnector | None:
    """The connector of a prefill or decode instance; None for a mixed one."""
    role = getattr(config, "splitwise_role", "mixed")
    if role not in ("prefill", "decode"):
        return None
    return PDConnector(PDSettings.from_config(config))
