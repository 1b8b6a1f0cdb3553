"""OpenAI-style API errors, raised by the serving layer and rendered by the HTTP adapter.

Every error the server returns is `{"error": {"message", "type", "param", "code"}}`; the message is one
line meant for the client and never contains a traceback.
"""

from __future__ import annotations

from http import HTTPStatus

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    502: "bad_gateway",  # fd router: the instance behind it failed
    503: "service_unavailable",
}


class APIError(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def to_dict(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(message, 400, param=param, code=code)


def from_exception(exc: BaseException) -> APIError:
    """Map an engine/domain exception to the APIError a client should see."""
    from fdcli_engine.api.protocol import EngineDeadError, EngineNotReadyError, EngineRequestError
    from fdcli_engine.errors import InvalidRequestError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(str(exc), 400, param=exc.param, code=exc.code)
    if isinstance(exc, EngineNotReadyError):
        return APIError(str(exc), 503, headers={"Retry-After": "5"})
    if isinstance(exc, EngineDeadError):
        return APIError(f"the engine is not running: {exc}", 503)
    if isinstance(exc, EngineRequestError):
        return APIError(f"the engine failed this request: {exc}", 500)
    return APIError(f"internal error ({type(exc).__name__}); see the server log", 500)


def status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
