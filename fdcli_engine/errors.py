"""Domain errors. Each carries a one-line message meant for a user; the CLI prints it, the server maps it
to an OpenAI error object. Leaf module: imports nothing from fd."""


class FdError(Exception):
    """Base of every error fd raises on purpose."""


class ConfigError(FdError):
    """An invalid option or combination of options, found before any work starts."""


def need(cond: bool, msg: str) -> None:
    """ConfigError(msg) unless `cond`: the one-line checks of the option validators."""
    if not cond:
        raise ConfigError(msg)


class ModelLoadError(FdError):
    """A model path that is missing, corrupt, truncated, or of an unsupported architecture."""


class InvalidRequestError(FdError, ValueError):
    """A request the engine cannot serve as asked (too long, bad parameter). `param` names the field;
    `code` is OpenAI's machine-readable code where it has one (`context_length_exceeded`).

    Also a ValueError, as vLLM raises for bad sampling parameters and over-long prompts, so offline
    callers' `except ValueError` catches it. An `except ValueError` around code that may raise it must
    let it through where its message and param should reach the user unchanged."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code
