"""One line of an OpenAI Batch file in, one output record out.

Input line:  {"custom_id": str, "method": "POST", "url": "/v1/...", "body": {...}}
Output line: {"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error"}

Error records (fd's convention, documented in docs/run-batch.md): `error` is
{"code", "message", "line"} with the 1-based input line number. A line the serving layer rejected
(HTTP-equivalent status, e.g. 400) also carries `response` with that status and the OpenAI error
object as body, exactly what `fd serve` would have answered; a line that never became a request
(bad JSON, missing fields, unknown url) has `response: null`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

MAX_CUSTOM_ID = 512  # characters; longer ids are a line error, not a memory problem in the id index


class LineError(Exception):
    """A line that cannot become a request. `code` is a stable machine-readable name."""

    def __init__(self, code: str, message: str, custom_id: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.custom_id = custom_id


@dataclass
class BatchLine:
    line_no: int
    custom_id: str
    url: str
    body: dict[str, Any]


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number"
    )


def custom_id_of(obj: Any) -> str | None:
    """The line's custom_id when it is a usable one (a non-empty string within the length limit)."""
    if not isinstance(obj, dict):
        return None
    cid = obj.get("custom_id")
    if isinstance(cid, str) and 0 < len(cid) <= MAX_CUSTOM_ID:
        return cid
    return None


def load_json_line(raw: bytes) -> Any:
    """Decode one input line; raises LineError('invalid_json') with the decoder's position."""
    try:
        # Decode explicitly: json.loads(bytes) would guess UTF-16/32 from a BOM instead of refusing it.
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise LineError("invalid_json", f"the line is not valid UTF-8: {e.reason}") from None
    except json.JSONDecodeError as e:
        raise LineError("invalid_json", f"the line is not valid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise LineError("invalid_json", "the line's JSON is nested too deeply") from None


def parse_line(line_no: int, raw: bytes, routes: dict[str, Any]) -> BatchLine:
    """Check the envelope of one line. `routes` maps the supported urls to their handlers."""
    obj = load_json_line(raw)
    if not isinstance(obj, dict):
        raise LineError("invalid_line", f"the line must be a JSON object, not {_type_name(obj)}")
    cid = custom_id_of(obj)
    if cid is None:
        raw_id = obj.get("custom_id")
        if raw_id is None:
            raise LineError("missing_custom_id", "the line has no custom_id")
        if not isinstance(raw_id, str):
            raise LineError("invalid_custom_id", f"custom_id must be a string, not {_type_name(raw_id)}")
        raise LineError("invalid_custom_id", f"custom_id must have 1 to {MAX_CUSTOM_ID} characters")
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise LineError("invalid_line", f"unknown field(s) {', '.join(map(repr, unknown))}", cid)
    method = obj.get("method", "POST")
    if method != "POST":
        raise LineError("invalid_method", f"method must be 'POST', got {method!r}", cid)
    url = obj.get("url")
    if url is None:
        raise LineError("missing_url", "the line has no url", cid)
    if url not in routes:
        supported = ", ".join(sorted(routes))
        raise LineError("invalid_url", f"url {url!r} is not supported; use one of: {supported}", cid)
    if "body" not in obj:
        raise LineError("missing_body", "the line has no body", cid)
    body = obj["body"]
    if not isinstance(body, dict):
        raise LineError("invalid_body", f"body must be a JSON object, not {_type_name(body)}", cid)
    if body.get("stream"):
        raise LineError("stream_unsupported", "stream=true is not supported in a batch; remove it", cid)
    return BatchLine(line_no, cid, url, body)


def new_record_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def success_record(custom_id: str, request_id: str, body: dict) -> dict:
    return {
        "id": new_record_id(),
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": request_id, "body": body},
        "error": None,
    }


def error_record(
    line_no: int,
    custom_id: str | None,
    code: str,
    message: str,
    status: int | None = None,
    error_body: dict | None = None,
) -> dict:
    """An error record; `status`/`error_body` are set when the serving layer answered the request."""
    response = None
    if status is not None:
        response = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": error_body}
    return {
        "id": new_record_id(),
        "custom_id": custom_id,
        "response": response,
        "error": {"code": code, "message": message, "line": line_no},
    }


def dump_record(record: dict) -> str:
    """One output line, newline included (json.dumps' default separators, as OpenAI writes them)."""
    return json.dumps(record, ensure_ascii=False) + "\n"


def record_key(record: Any) -> tuple[str, Any] | None:
    """What makes a record 'done' for --resume: its custom_id, else the line number of its error."""
    if not isinstance(record, dict):
        return None
    cid = record.get("custom_id")
    if isinstance(cid, str):
        return ("id", cid)
    err = record.get("error")
    if isinstance(err, dict) and isinstance(err.get("line"), int):
        return ("line", err["line"])
    return None


def line_key(line_no: int, custom_id: str | None) -> tuple[str, Any]:
    return ("id", custom_id) if custom_id is not None else ("line", line_no)
