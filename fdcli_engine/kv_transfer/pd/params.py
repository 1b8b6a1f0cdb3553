"""vLLM's `kv_transfer_params` of one request: what the router asks an instance to do with its KV.

Prefill side: {"do_remote_decode": true, "transfer_id": ..., "remote_kv_address": "tcp://..."}.
Decode side: {"do_remote_prefill": true, "transfer_id": ...}. Leaf module.
"""

from __future__ import annotations

from dataclasses import dataclass

from fdcli_engine.errors import InvalidRequestError

MAX_ID = 256

_WANTS = {"do_remote_decode": "prefill", "do_remote_prefill": "decode"}


@dataclass(frozen=True)
class TransferParams:
    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    transfer_id: str = ""
    remote_kv_address: str = ""


def parse_transfer_params(params: dict | None, role: str) -> TransferParams | None:
    """The request's transfer, or None for a plain request; a 400 naming `kv_transfer_params` for a
    malformed one or one asking for a role this instance does not have."""
    if not params:
        return None

    def bad(msg: str) -> InvalidRequestError:
        return InvalidRequestError(f"kv_transfer_params: {msg}", param="kv_transfer_params")

    if not isinstance(params, dict):
        raise bad("must be an object")
    asked = [k for k in _WANTS if params.get(k)]
    if not asked:
        return None
    if len(asked) > 1:
        raise bad("do_remote_decode and do_remote_prefill exclude each other")
    need = _WANTS[asked[0]]
    if role != need:
        raise bad(f"{asked[0]} needs an instance started with --splitwise-role {need}; this one is {role}")
    tid = params.get("transfer_id")
    if not isinstance(tid, str) or not 0 < len(tid) <= MAX_ID:
        raise bad(f"transfer_id must be a string of 1 to {MAX_ID} characters")
    address = params.get("remote_kv_address") or ""
    if need == "prefill" and not (
        isinstance(address, str) and address.startswith(("tcp://", "ipc://")) and len(address) <= 512
    ):
        raise bad("remote_kv_address must be the decode instance's tcp:// or ipc:// address")
    return TransferParams(
        do_remote_decode=need == "prefill",
        do_remote_prefill=need == "decode",
        transfer_id=tid,
        remote_kv_address=address,
    )
