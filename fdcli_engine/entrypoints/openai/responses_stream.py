"""The output-item events of one streamed /v1/responses reply, in the order the `openai` SDK's
`client.responses.stream` accumulates them.

Each output item (a reasoning item when the server's reasoning parser splits reasoning out, then the
message, then the function calls) is opened when its first text arrives and closed before the next one opens:

  response.output_item.added → response.content_part.added → response.<kind>.delta …
  → response.<kind>.done → response.content_part.done → response.output_item.done

where <kind> is `reasoning_text` or `output_text`. The message item is sent, empty if the model wrote
no answer, unless the model called functions: each call is sent whole at the end (output_item.added,
function_call_arguments.delta and .done, output_item.done). Events are numbered from 0 (`sequence_number`) across the whole stream.
"""

from __future__ import annotations

import json

from fdcli_engine.entrypoints.openai.protocol_responses import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
)


class EventWriter:
    """Responses SSE events: `event: TYPE` + `data: {"type", "sequence_number", ...}`."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def emit(self, kind: str, **fields) -> str:
        body = json.dumps({"type": kind, "sequence_number": self.sequence_number, **fields})
        self.sequence_number += 1
        return f"event: {kind}\ndata: {body}\n\n"


class OutputItems:
    """Opens, feeds and closes the output items; `items` holds the closed ones for the final Response."""

    def __init__(self, events: EventWriter, request_key: str):
        self.events = events
        self.key = request_key
        self.items: list[ReasoningItem | OutputMessage | FunctionCallItem] = []
        self._open: str | None = None  # "reasoning" | "message"
        self._text = ""
        # Token logprobs (include=["message.output_text.logprobs"]): those not yet sent with a message
        # delta, and all of the message's.
        self._pending_logprobs: list[dict] = []
        self._logprobs: list[dict] = []

    def add_logprobs(self, logprobs: list[dict]) -> None:
        """The logprobs of the engine delta about to be fed: sent with the next message delta."""
        self._pending_logprobs += logprobs

    def _where(self) -> dict:
        return {"item_id": self._item_id(self._open), "output_index": len(self.items), "content_index": 0}

    def _item_id(self, kind: str) -> str:
        return ("rs_" if kind == "reasoning" else "msg_") + self.key

    def feed(self, kind: str, delta: str) -> list[str]:
        """The events that add `delta` to the item of `kind` (opening it, closing the other first)."""
        out = []
        if self._open != kind:
            out += self.close("completed")
            out += self._start(kind)
        self._text += delta
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        extra = {}
        if kind == "message":
            extra = {"logprobs": self._pending_logprobs}
            self._logprobs += self._pending_logprobs
            self._pending_logprobs = []
        out.append(self.events.emit(f"response.{name}.delta", **self._where(), delta=delta, **extra))
        return out

    def _start(self, kind: str) -> list[str]:
        self._open, self._text = kind, ""
        item = {"id": self._item_id(kind), "type": kind, "status": "in_progress", "content": []}
        if kind == "message":
            item["role"] = "assistant"
        else:
            item["summary"] = []
        part = (ReasoningText(text="") if kind == "reasoning" else OutputText(text="")).model_dump()
        return [
            self.events.emit("response.output_item.added", output_index=len(self.items), item=item),
            self.events.emit("response.content_part.added", **self._where(), part=part),
        ]

    def close(self, status: str) -> list[str]:
        """The events that finish the open item (none if no item is open)."""
        if self._open is None:
            return []
        kind, where, text = self._open, self._where(), self._text
        if kind == "message":  # tokens that wrote no text (the end-of-text token) are still the answer's
            self._logprobs += self._pending_logprobs
            self._pending_logprobs = []
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        extra = {"logprobs": self._logprobs} if kind == "message" else {}
        if kind == "reasoning":
            part = ReasoningText(text=text)
            item = ReasoningItem(id=where["item_id"], content=[part], status=status)
        else:
            part = OutputText(text=text, logprobs=self._logprobs)
            item = OutputMessage(id=where["item_id"], status=status, content=[part])
        out = [
            self.events.emit(f"response.{name}.done", **where, text=text, **extra),
            self.events.emit("response.content_part.done", **where, part=part.model_dump()),
            self.events.emit(
                "response.output_item.done", output_index=where["output_index"], item=item.model_dump()
            ),
        ]
        self.items.append(item)
        self._open = None
        return out

    def finish(self, status: str, calls: list[FunctionCallItem] = ()) -> list[str]:
        """Close everything, then send the function calls; a reply with neither answer text nor calls
        still ends with its (empty) message."""
        out = []
        if self._open == "reasoning":
            out += self.close(status)  # cut inside the reasoning: it is as incomplete as the reply
        if self._open is None and not calls:
            out += self._start("message")
        out += self.close(status)
        for call in calls:
            out += self._function_call(call)
        return out

    def _function_call(self, call: FunctionCallItem) -> list[str]:
        where = {"item_id": call.id, "output_index": len(self.items)}
        opened = call.model_copy(update={"arguments": "", "status": "in_progress"}).model_dump()
        self.items.append(call)
        return [
            self.events.emit("response.output_item.added", output_index=where["output_index"], item=opened),
            self.events.emit("response.function_call_arguments.delta", **where, delta=call.arguments),
            self.events.emit("response.function_call_arguments.done", **where, arguments=call.arguments),
            self.events.emit(
                "response.output_item.done", output_index=where["output_index"], item=call.model_dump()
            ),
        ]
