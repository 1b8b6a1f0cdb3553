"""The options of the serving layer, the same for `fd serve` and `fd run-batch`: served model names,
chat template, reasoning and tool-call parsers. Framework-free (run-batch imports it).

`check_serving_options` runs before the model loads: an unknown parser, a chat template that is
neither a file nor Jinja, or --enable-auto-tool-choice without a parser is a ConfigError then, not a
400 at the first request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError
from fdcli_engine.multimodal.image_limit import parse_image_limit
from fdcli_engine.multimodal.media import MediaPolicy
from fdcli_engine.multimodal.media_flags import policy_from_flags


@dataclass(frozen=True)
class ServingOptions:
    served_model_names: list[str] | None = None  # None: the engine's served_model_name
    chat_template: str | None = None  # the template text (load_chat_template reads a file)
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None  # parses tool calls when a request has tools (tool_choice "auto")
    enable_auto_tool_choice: bool = False  # vLLM's flag, accepted for its command lines; needs the parser
    trust_request_chat_template: bool = False
    # Unknown request fields: False ignores them (logged once, named in the fd-ignored-fields header,
    # as vLLM ignores them); True answers OpenAI's 400 "Unrecognized request argument supplied".
    strict_request_fields: bool = False
    # vLLM's --return-tokens-as-token-ids: logprobs name tokens "token_id:N" unless a request's
    # return_tokens_as_token_ids says otherwise.
    return_tokens_as_token_ids: bool = False
    # vLLM's --response-role (fd run-batch): the role of a chat answer to a new turn (serving_chat.role_of).
    response_role: str = "assistant"
    # vLLM's --enable-force-include-usage: every chat and completions stream carries usage on each chunk
    # and ends with a usage chunk, whatever its stream_options (a response that does not stream always
    # carries usage).
    enable_force_include_usage: bool = False
    # --- image inputs (docs/images.md): vLLM's flags; http(s) and local files are off unless given ---
    allowed_local_media_path: str | None = None
    allowed_media_domains: list[str] | None = None  # each item may hold several, comma-separated
    limit_mm_per_prompt: str | dict | None = None  # vLLM's JSON '{"image": 4}' (or the mapping)
    # The policy itself, for tests only (a fixture server on 127.0.0.1 needs the loopback allowance);
    # None: built from the three flags above.
    media_policy: MediaPolicy | None = None
    # --- end image inputs ---


def default_served_name(config: EngineConfig) -> str:
    """The --model string as given; for a .gguf file its stem (the default model's path is long)."""
    model = str(config.model or config.model_path)
    return Path(model).stem if model.endswith(".gguf") else model


def load_chat_template(value: str | None) -> str | None:
    """`--chat-template` is a file path, or the template itself when it holds Jinja markup."""
    if value is None or "{%" in value or "{{" in value:
        return value
    p = Path(value).expanduser()
    if not p.is_file():
        raise ConfigError(f"--chat-template {value!r} is neither a file nor a Jinja template")
    return p.read_text()


def check_serving_options(options: ServingOptions) -> None:
    """ConfigError for an unknown parser, or --enable-auto-tool-choice without --tool-call-parser (as
    in vLLM). The parser alone enables tool_choice "auto" (FastDeploy's behaviour); vLLM's
    --enable-auto-tool-choice is accepted so its command lines work."""
    from fdcli_engine.entrypoints.openai.reasoning import get_parser_cls
    from fdcli_engine.entrypoints.openai.tool_parsers import get_tool_parser_cls

    image_limit(options)
    media_policy(options)
    get_parser_cls(options.reasoning_parser)
    get_tool_parser_cls(options.tool_call_parser)
    if options.enable_auto_tool_choice and not options.tool_call_parser:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser (e.g. hermes)")


def image_limit(options: ServingOptions) -> int:
    """The most images one request may carry, from --limit-mm-per-prompt (ConfigError if malformed)."""
    return parse_image_limit(options.limit_mm_per_prompt)


def media_policy(options: ServingOptions) -> MediaPolicy:
    """Where image URLs may point, from the flags (or the test's own policy)."""
    if options.media_policy is not None:
        return options.media_policy
    return policy_from_flags(options.allowed_local_media_path, options.allowed_media_domains)
