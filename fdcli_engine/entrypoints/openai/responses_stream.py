"""The output-item events of one streamed /v1/responses reply, in the order OpenAI's API sends them
and the `openai` SDK's `client.responses.stream` accumulates them.

Output items (a reasoning item when the server's reasoning parser splits reasoning out, the message,
the function calls) are sent one at a time: each is opened when its first part arrives and closed
before the next one opens. Text items:

  response.output_item.added → response.content_part.added → response.<kind>.delta …
  → response.<kind>.done → response.content_part.done → response.output_item.done

where <kind> is `reasoning_text` or `output_text`. A function call (vLLM's and OpenAI's sequence):

  response.output_item.added (name, call_id, arguments "") → response.function_call_arguments.delta …
  → response.function_call_arguments.done (arguments, name) → response.output_item.done

with each argument fragment sent as the tool parser reads it (serving_tools.OutputSplitter: the
fragments add up to the whole response's arguments). Calls that turn out malformed when the output
ends (cut off by max_output_tokens) are closed `incomplete`, and their text follows as a message, as
in the whole response. A reply with neither answer text nor calls
still ends with its (empty) message. Events are numbered from 0 (`sequence_number`) across the whole
stream.
"""

from __future__ import annotations

import json

from fdcli_engine.entrypoints.openai.protocol import DeltaToolCall
from fdcli_engine.entrypoints.openai.protocol_responses import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
)

OutputItem = ReasoningItem | OutputMessage | FunctionCallItem


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
        self.items: list[OutputItem] = []
        self._open: str | None = None  # "reasoning" | "message" | "function_call"
        self._text = ""
        self._call: FunctionCallItem | None = None  # the open function call, arguments so far
        self._calls = 0
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
        """rs_KEY and msg_KEY (as the whole response's items); a second item of a kind (text after
        a call) gets its output index appended, so no two items share an id."""
        base = ("rs_" if kind == "reasoning" else "msg_") + self.key
        taken = any(item.id == base for item in self.items)
        return f"{base}_{len(self.items)}" if taken else base

    def feed(self, kind: str, delta: str) -> list[str]:
        """The events that add `delta` to the item of `kind` (opening it, closing the other first)."""
        out = []
        if self._open != kind:
            # Text after a call: the splitter found the calls malformed at the end (cut off) and
            # sends their text as content, so the call item is left incomplete.
            out += self.close("incomplete" if self._open == "function_call" else "completed")
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

    def feed_call(self, part: DeltaToolCall) -> list[str]:
        """The events of one streamed tool-call part: a part with an id opens that call's item (after
        closing the open one), its arguments and later parts' are argument deltas."""
        out = []
        function = part.function or {}
        if part.id is not None:
            out += self.close("completed")
            out += self._start_call(part.id, function.get("name") or "")
        delta = function.get("arguments") or ""
        if delta and self._call is not None:
            self._call.arguments += delta
            where = {"item_id": self._call.id, "output_index": len(self.items)}
            out.append(self.events.emit("response.function_call_arguments.delta", **where, delta=delta))
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

    def _start_call(self, call_id: str, name: str) -> list[str]:
        """A function call's item: fc_KEY_K for the K-th call, as in the whole response."""
        self._open = "function_call"
        item_id = f"fc_{self.key}_{self._calls}"
        self._calls += 1
        self._call = FunctionCallItem(
            id=item_id, call_id=call_id, name=name, arguments="", status="in_progress"
        )
        opened = self._call.model_dump()
        return [self.events.emit("response.output_item.added", output_index=len(self.items), item=opened)]

    def close(self, status: str) -> list[str]:
        """The events that finish the open item (none if no item is open)."""
        if self._open is None:
            return []
        if self._open == "function_call":
            return self._close_call(status)
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

    def _close_call(self, status: str) -> list[str]:
        call = self._call.model_copy(update={"status": status})
        where = {"item_id": call.id, "output_index": len(self.items)}
        out = [
            self.events.emit(
                "response.function_call_arguments.done", **where, arguments=call.arguments, name=call.name
            ),
            self.events.emit(
                "response.output_item.done", output_index=where["output_index"], item=call.model_dump()
            ),
        ]
        self.items.append(call)
        self._open, self._call = None, None
        return out

    def finish(self, status: str) -> list[str]:
        """Close the open item with the reply's status; a reply with neither answer text nor calls
        still ends with its (empty) message."""
        out = []
        if self._open == "reasoning":
            out += self.close(status)  # cut inside the reasoning: it is as incomplete as the reply
        if self._open is None and not any(item.type in ("message", "function_call") for item in self.items):
            out += self._start("message")
        return out + self.close(status)
