"""Messages between the server front end and the engine-core process (msgpack via msgspec; never pickle).

Front end → core: AddRequest (the EngineCoreRequest itself), AbortRequest, UtilityRequest, Shutdown
(one tagged union, `CoreInput`).
Core → front end: ReadyMsg, OutputsMsg, UtilityReply, RequestFailed, FatalMsg, Heartbeat (`CoreEvent`).
Leaf module: only msgspec and the leaf contracts.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from fdcli_engine.outputs import EngineCoreOutput
from fdcli_engine.request import EngineCoreRequest

AddRequest = EngineCoreRequest  # the add message is the request the core takes, one struct


class AbortRequest(msgspec.Struct, tag="abort"):
    req_ids: list[str]


class UtilityRequest(msgspec.Struct, tag="utility"):
    call_id: int
    method: str  # only "get_stats" today


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


class ReadyMsg(msgspec.Struct, tag="ready"):
    max_model_len: int
    vocab_size: int = 0


class OutputsMsg(msgspec.Struct, tag="outputs"):
    outputs: list[EngineCoreOutput]


class UtilityReply(msgspec.Struct, tag="reply"):
    call_id: int
    result: Any = None
    error: str | None = None


class RequestFailed(msgspec.Struct, tag="failed"):
    """One request could not be served; `status` is the HTTP status the front end should use."""

    req_id: str
    message: str
    status: int = 400
    param: str | None = None


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    """Sent while the core has work and has sent nothing else for HEARTBEAT_S: steps are being taken
    (the front end's watchdog reads any event as progress)."""


class FatalMsg(msgspec.Struct, tag="fatal"):
    """The core cannot continue (model load failed, ...); it exits after sending this."""

    message: str


CoreInput = Union[AddRequest, AbortRequest, UtilityRequest, Shutdown]
CoreEvent = Union[ReadyMsg, OutputsMsg, UtilityReply, RequestFailed, FatalMsg, Heartbeat]

input_encoder = msgspec.msgpack.Encoder()
input_decoder = msgspec.msgpack.Decoder(CoreInput)
event_encoder = msgspec.msgpack.Encoder()
event_decoder = msgspec.msgpack.Decoder(CoreEvent)
