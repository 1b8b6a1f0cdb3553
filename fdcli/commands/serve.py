"""`fd serve`: the OpenAI-compatible HTTP server (FastAPI front end + engine-core process).

`--config FILE.yaml` holds engine and server options alike (flag names, `-` or `_`); flags given on the
command line win; an unknown key is an error. Engine internals load only inside the command.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from fdcli.console import BadInput, error_boundary, fail
from fdcli.options import (
    ALL_ENGINE_FLAGS,
    CORS_LIST_KEYS,
    AllowCredentialsOpt,
    AllowedHeadersOpt,
    AllowedLocalMediaOpt,
    AllowedMediaDomainsOpt,
    AllowedMethodsOpt,
    AllowedOriginsOpt,
    AutoToolChoiceOpt,
    ChatTemplateOpt,
    ConfigFileOpt,
    LimitMmOpt,
    ModelTagArg,
    ReasoningParserOpt,
    ResponseRoleOpt,
    StrictFieldsOpt,
    ToolCallParserOpt,
    TrustTemplateOpt,
    merge_engine_options,
    parse_cors_list,
    with_model_tag,
)

SERVER_PANEL = "Server options"


def _opt(*names: str, help: str, **kw) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=SERVER_PANEL, **kw)


HostOpt = Annotated[Optional[str], _opt("--host", help="Address to listen on. (default: 127.0.0.1)")]
PortOpt = Annotated[Optional[int], _opt("--port", help="Port to listen on. (default: 8000)")]
ApiKeyOpt = Annotated[
    Optional[list[str]],
    _opt(
        "--api-key",
        help="Require this key (Authorization: Bearer, or x-api-key; repeatable). Default: $FD_API_KEY. "
        "Empty: no key (as vLLM). "
        "On the command line it is visible to every user of the machine (ps): prefer --api-key-file.",
        envvar="FD_API_KEY",
    ),
]
ApiKeyFileOpt = Annotated[
    Optional[Path],
    _opt(
        "--api-key-file",
        help="Require the keys in this file: one per line; blank lines and # comments skipped.",
    ),
]
MaxConcurrencyOpt = Annotated[
    Optional[int], _opt("--max-concurrency", help="Requests served at once; more wait. (default: 256)")
]
MaxWaitingTimeOpt = Annotated[
    Optional[float],
    _opt(
        "--max-waiting-time",
        help="Seconds a request may wait for a slot before a 429 (0: reject at once, <0: no limit). (default: -1)",
    ),
]
MaxQueueOpt = Annotated[
    Optional[int],
    _opt("--max-queue-size", help="Requests that may wait for a slot; more get 429. (default: 1024)"),
]
GracefulOpt = Annotated[
    Optional[float],
    _opt("--timeout-graceful-shutdown", help="Seconds running requests get on SIGTERM. (default: 30)"),
]
MaxBodyOpt = Annotated[
    Optional[int], _opt("--max-request-body-bytes", help="Largest request body accepted. (default: 32 MiB)")
]
LogLevelOpt = Annotated[
    Optional[str], _opt("--uvicorn-log-level", help="uvicorn's log level. (default: warning)")
]
# FastDeploy's --metrics-port: /metrics alone on its own port, on --host's address, without the API key.
MetricsPortOpt = Annotated[
    Optional[int],
    _opt(
        "--metrics-port", help="Also serve /metrics on this port (same address as --host; no API key needed)."
    ),
]

# vLLM's --return-tokens-as-token-ids: the default of the requests' return_tokens_as_token_ids.
TokensAsIdsOpt = Annotated[
    Optional[bool],
    _opt(
        "--return-tokens-as-token-ids",
        help='Logprobs name each token "token_id:N" (exact for tokens that are not whole characters); '
        "a request's return_tokens_as_token_ids overrides it.",
    ),
]

# HTTP framing limits (http_guard.py); vLLM's --h11-* names and uvicorn's --timeout-keep-alive.
HeadBytesOpt = Annotated[
    Optional[int],
    _opt(
        "--h11-max-incomplete-event-size",
        help="Largest request head (request line + headers) in bytes; more: 431. (default: 4 MiB)",
    ),
]
HeaderCountOpt = Annotated[
    Optional[int],
    _opt("--h11-max-header-count", help="Most headers in one request; more: 431. (default: 256)"),
]
HeadTimeoutOpt = Annotated[
    Optional[float],
    _opt(
        "--timeout-request-header",
        help="Seconds a client has to send a request's headers; then 408 and close. (default: 30)",
    ),
]
BodyTimeoutOpt = Annotated[
    Optional[float],
    _opt(
        "--timeout-request-body",
        help="Seconds a client has to send a request's body after its headers; then 408 and close. (default: 120)",
    ),
]
MaxConnectionsOpt = Annotated[
    Optional[int],
    _opt(
        "--max-connections",
        help="Open connections; one more closes the longest-idle one, or gets 503 if none is idle. (default: 2048)",
    ),
]
KeepAliveOpt = Annotated[
    Optional[float],
    _opt("--timeout-keep-alive", help="Seconds an idle kept-alive connection stays open. (default: 5)"),
]
# vLLM's server flags (fdcli_engine.vllm_compat has the meaning of those without an effect here).
RootPathOpt = Annotated[
    Optional[str],
    _opt("--root-path", help="ASGI root_path, behind a proxy that serves fd under a path prefix."),
]
RequestIdHeadersOpt = Annotated[
    Optional[bool],
    _opt(
        "--enable-request-id-headers",
        help="Send X-Request-Id on every response (the client's, or a new one).",
    ),
]
NoAccessLogOpt = Annotated[
    Optional[bool],
    _opt("--disable-uvicorn-access-log", help="No effect: fd's server writes no access log anyway."),
]
# vLLM's HTTPS, docs, usage, load and logging flags (ServerArgs says what each does).
SslKeyfileOpt = Annotated[Optional[str], _opt("--ssl-keyfile", help="HTTPS: the private key file (PEM).")]
SslCertfileOpt = Annotated[
    Optional[str], _opt("--ssl-certfile", help="HTTPS: the certificate (chain) file (PEM); turns HTTPS on.")
]
SslCaCertsOpt = Annotated[
    Optional[str],
    _opt("--ssl-ca-certs", help="HTTPS: CA certificates that client certificates are checked against."),
]
SslCertReqsOpt = Annotated[
    Optional[int],
    _opt(
        "--ssl-cert-reqs",
        help="HTTPS: client certificates, the ssl module's 0 (CERT_NONE), 1 (optional) or 2 (required). "
        "(default: 0)",
    ),
]
SslCiphersOpt = Annotated[
    Optional[str], _opt("--ssl-ciphers", help="HTTPS: cipher suites for TLS 1.2 and below (OpenSSL list).")
]
NoDocsOpt = Annotated[
    Optional[bool], _opt("--disable-fastapi-docs", help="No /openapi.json, /docs or /redoc.")
]
ForceUsageOpt = Annotated[
    Optional[bool],
    _opt(
        "--enable-force-include-usage",
        help="Chat and completions streams carry usage on every chunk and end with a usage chunk.",
    ),
]
LoadTrackingOpt = Annotated[
    Optional[bool],
    _opt(
        "--enable-server-load-tracking",
        help='GET /load answers {"server_load": requests being served} (else 0).',
    ),
]
LogConfigOpt = Annotated[
    Optional[str],
    _opt("--log-config-file", help="A logging.config.dictConfig JSON file, for fd's and uvicorn's loggers."),
]
SSL_KEYS = ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs")
FRAMING_KEYS = (
    "h11_max_incomplete_event_size",
    "h11_max_header_count",
    "timeout_request_header",
    "timeout_request_body",
    "max_connections",
    "timeout_keep_alive",
)

# Server option -> ServerArgs field, or ServingOptions field of the same name (`serving`); the keys a
# YAML file may hold besides the engine options.
SERVER_KEYS = {
    "host": "host",
    "port": "port",
    "api_key": "api_keys",
    "api_key_file": "api_keys",  # read into the key list before ServerArgs is built
    "max_concurrency": "max_concurrency",
    "max_waiting_time": "max_waiting_time",
    "max_queue_size": "max_queue_size",
    "timeout_graceful_shutdown": "timeout_graceful_shutdown",
    "reasoning_parser": "reasoning_parser",
    "tool_call_parser": "tool_call_parser",
    "enable_auto_tool_choice": "enable_auto_tool_choice",
    "chat_template": "chat_template",
    "trust_request_chat_template": "trust_request_chat_template",
    "strict_request_fields": "strict_request_fields",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids",
    "response_role": "response_role",
    # image inputs
    "allowed_local_media_path": "allowed_local_media_path",
    "allowed_media_domains": "allowed_media_domains",
    "limit_mm_per_prompt": "limit_mm_per_prompt",
    "max_request_body_bytes": "max_request_body_bytes",
    "uvicorn_log_level": "uvicorn_log_level",
    "metrics_port": "metrics_port",
    # CORS
    "allowed_origins": "allowed_origins",
    "allowed_methods": "allowed_methods",
    "allowed_headers": "allowed_headers",
    "allow_credentials": "allow_credentials",
    "root_path": "root_path",
    "enable_request_id_headers": "enable_request_id_headers",
    "disable_uvicorn_access_log": "disable_uvicorn_access_log",
    **{k: k for k in FRAMING_KEYS},
    **{k: k for k in SSL_KEYS},
    "ssl_cert_reqs": "ssl_cert_reqs",
    "ssl_ciphers": "ssl_ciphers",
    "disable_fastapi_docs": "disable_fastapi_docs",
    "enable_force_include_usage": "enable_force_include_usage",
    "enable_server_load_tracking": "enable_server_load_tracking",
    "log_config_file": "log_config_file",
}


def read_api_key_file(path: Path) -> list[str]:
    """The keys of an --api-key-file: one per line, surrounding blanks stripped, blank lines and lines
    starting with # skipped. A file without a key is an error (it would leave the server open)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(
            f"cannot read --api-key-file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise BadInput(f"--api-key-file {str(path)!r} holds no key")
    return keys


def drop_empty_api_keys(keys: list[str]) -> list[str]:
    """vLLM's rule: an empty --api-key (or `api-key: ""` in --config) asks for no key, as FD_API_KEY=""
    does (the environment variable set to nothing reads as unset); said once on stderr, never a key
    that no client can send (every request would be a 401)."""
    kept = [k for k in keys if k]
    if len(kept) < len(keys):
        sys.stderr.write(
            "Warning: an empty --api-key is skipped; the other keys are required\n"
            if kept
            else 'Warning: --api-key is empty: the server requires no API key (as vLLM, and FD_API_KEY="")\n'
        )
    return kept


def _load_yaml(path: Path) -> dict[str, Any]:
    from fdcli.options import _load_yaml as load  # the shared reader: one error style for bad files

    return {str(k).replace("-", "_"): v for k, v in load(path).items()}


_TYPES = {
    "host": str,
    "port": int,
    "api_key": list,
    "api_key_file": str,
    "max_concurrency": int,
    "max_waiting_time": float,
    "max_queue_size": int,
    "timeout_graceful_shutdown": float,
    "reasoning_parser": str,
    "tool_call_parser": str,
    "enable_auto_tool_choice": bool,
    "chat_template": str,
    "trust_request_chat_template": bool,
    "strict_request_fields": bool,
    "return_tokens_as_token_ids": bool,
    "response_role": str,
    "allowed_local_media_path": str,
    "allowed_media_domains": list,
    "limit_mm_per_prompt": dict,  # a mapping or its JSON text; the counts are checked at start
    "max_request_body_bytes": int,
    "uvicorn_log_level": str,
    "metrics_port": int,
    "allow_credentials": bool,  # the CORS lists are parsed by fdcli.options.parse_cors_list
    "h11_max_incomplete_event_size": int,
    "h11_max_header_count": int,
    "timeout_request_header": float,
    "timeout_request_body": float,
    "max_connections": int,
    "timeout_keep_alive": float,
    "root_path": str,
    "enable_request_id_headers": bool,
    "disable_uvicorn_access_log": bool,
    "ssl_keyfile": str,
    "ssl_certfile": str,
    "ssl_ca_certs": str,
    "ssl_cert_reqs": int,
    "ssl_ciphers": str,
    "disable_fastapi_docs": bool,
    "enable_force_include_usage": bool,
    "enable_server_load_tracking": bool,
    "log_config_file": str,
}


_TYPE_WORDS = {list: "a string or list of strings", dict: "a mapping or its JSON text"}


def _is_json_object(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def _coerce(key: str, value: Any) -> Any:
    """A server option from the YAML file, checked against its flag's type (ConfigError if wrong)."""
    from fdcli_engine.errors import ConfigError

    if key in CORS_LIST_KEYS:
        return parse_cors_list(key, value)
    want = _TYPES[key]
    if want is list:
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    elif want is dict and (isinstance(value, dict) or _is_json_object(value)):
        return value
    elif want is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif isinstance(value, want) and not (want is int and isinstance(value, bool)):
        return value
    flag = "--" + key.replace("_", "-")
    raise ConfigError(f"{flag} in --config must be {_TYPE_WORDS.get(want, want.__name__)}")


def _with_engine_flags(func):
    """Like fdcli.options.engine_options, but the YAML file may also hold server options."""
    sig = inspect.signature(func, eval_str=True)
    own = [p for n, p in sig.parameters.items() if n not in ("engine_args", "file_values")]
    tag = inspect.Parameter("model_tag", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ModelTagArg)
    added = [tag] + [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=alias)
        for name, alias in {"config": ConfigFileOpt, **ALL_ENGINE_FLAGS}.items()
    ]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        flags = {name: kwargs.pop(name, None) for name in ALL_ENGINE_FLAGS}
        config_file = kwargs.pop("config", None)
        model_tag = kwargs.pop("model_tag", None)
        with error_boundary():
            flags = with_model_tag(flags, model_tag)
            file_values = _load_yaml(config_file) if config_file is not None else {}
            server_file = {k: file_values.pop(k) for k in list(file_values) if k in SERVER_KEYS}
            engine_args = merge_engine_options(file_values, flags, f"--config {config_file}")
        return func(engine_args=engine_args, file_values=server_file, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + added)
    wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
    del wrapper.__wrapped__
    return wrapper


def _check_https(args) -> None:
    """vLLM's --ssl-* flags: readable files, a certificate whenever a key or CA is given, and the ssl
    module's client-certificate modes (one error line each, before the model loads)."""
    for key in SSL_KEYS:
        path = getattr(args, key)
        if path is not None and not Path(path).is_file():
            fail(f"--{key.replace('_', '-')} {path!r} is not a file", 2)
    if (args.ssl_keyfile or args.ssl_ca_certs) and not args.ssl_certfile:
        fail("--ssl-keyfile and --ssl-ca-certs need --ssl-certfile (the server's certificate)", 2)
    if args.ssl_cert_reqs not in (0, 1, 2):
        fail(f"--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required), got {args.ssl_cert_reqs}", 2)
    if args.ssl_cert_reqs and not args.ssl_ca_certs:
        fail(
            "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs (the CAs client certificates are checked against)", 2
        )


@_with_engine_flags
def serve(
    *,
    host: HostOpt = None,
    port: PortOpt = None,
    api_key: ApiKeyOpt = None,
    api_key_file: ApiKeyFileOpt = None,
    max_concurrency: MaxConcurrencyOpt = None,
    max_waiting_time: MaxWaitingTimeOpt = None,
    max_queue_size: MaxQueueOpt = None,
    timeout_graceful_shutdown: GracefulOpt = None,
    reasoning_parser: ReasoningParserOpt = None,
    tool_call_parser: ToolCallParserOpt = None,
    enable_auto_tool_choice: AutoToolChoiceOpt = None,
    chat_template: ChatTemplateOpt = None,
    trust_request_chat_template: TrustTemplateOpt = None,
    strict_request_fields: StrictFieldsOpt = None,
    response_role: ResponseRoleOpt = None,
    allowed_local_media_path: AllowedLocalMediaOpt = None,
    allowed_media_domains: AllowedMediaDomainsOpt = None,
    limit_mm_per_prompt: LimitMmOpt = None,
    max_request_body_bytes: MaxBodyOpt = None,
    uvicorn_log_level: LogLevelOpt = None,
    metrics_port: MetricsPortOpt = None,
    return_tokens_as_token_ids: TokensAsIdsOpt = None,
    allowed_origins: AllowedOriginsOpt = None,
    allowed_methods: AllowedMethodsOpt = None,
    allowed_headers: AllowedHeadersOpt = None,
    allow_credentials: AllowCredentialsOpt = None,
    h11_max_incomplete_event_size: HeadBytesOpt = None,
    h11_max_header_count: HeaderCountOpt = None,
    timeout_request_header: HeadTimeoutOpt = None,
    timeout_request_body: BodyTimeoutOpt = None,
    max_connections: MaxConnectionsOpt = None,
    timeout_keep_alive: KeepAliveOpt = None,
    root_path: RootPathOpt = None,
    enable_request_id_headers: RequestIdHeadersOpt = None,
    disable_uvicorn_access_log: NoAccessLogOpt = None,
    ssl_keyfile: SslKeyfileOpt = None,
    ssl_certfile: SslCertfileOpt = None,
    ssl_ca_certs: SslCaCertsOpt = None,
    ssl_cert_reqs: SslCertReqsOpt = None,
    ssl_ciphers: SslCiphersOpt = None,
    disable_fastapi_docs: NoDocsOpt = None,
    enable_force_include_usage: ForceUsageOpt = None,
    enable_server_load_tracking: LoadTrackingOpt = None,
    log_config_file: LogConfigOpt = None,
    engine_args: dict,
    file_values: dict,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (default: SmolLM2 on 127.0.0.1:8000)."""
    from fdcli_engine.config import EngineConfig
    from fdcli_engine.entrypoints.openai.app_state import ServerArgs
    from fdcli_engine.entrypoints.openai.launcher import read_log_config, run_server
    from fdcli_engine.entrypoints.openai.serving_options import ServingOptions

    cli = dict(locals())
    with error_boundary():
        values = {k: _coerce(k, v) for k, v in file_values.items()}
    values.update({k: cli[k] for k in SERVER_KEYS if cli.get(k) not in (None, [])})
    with error_boundary():
        values.update({k: parse_cors_list(k, values[k]) for k in CORS_LIST_KEYS if k in values})
    if isinstance(values.get("api_key"), str):
        values["api_key"] = [values["api_key"]]
    if "api_key" in values:
        values["api_key"] = drop_empty_api_keys(values["api_key"])
    # Only a key that was typed shows in ps (an empty one asks for none; FD_API_KEY never shows).
    typed = any(a == "--api-key" or a.startswith("--api-key=") for a in sys.argv[1:])
    if typed and any(cli.get("api_key") or []):
        sys.stderr.write(
            "Warning: --api-key on the command line is visible to every user of this machine (ps); "
            "use --api-key-file or FD_API_KEY\n"
        )
    key_file = values.pop("api_key_file", None)
    if key_file is not None:
        with error_boundary():
            values["api_key"] = [*values.get("api_key", []), *read_api_key_file(Path(key_file))]
    serving = {k: values.pop(k) for k in list(values) if k in ServingOptions.__dataclass_fields__}
    names = EngineConfig.from_dict(engine_args).served_model_names  # merge_engine_options checked them
    if names:
        serving["served_model_names"] = names
    args = ServerArgs(**{SERVER_KEYS[k]: v for k, v in values.items()}, serving=ServingOptions(**serving))
    if not 0 < args.port < 65536:
        fail(f"--port must be between 1 and 65535, got {args.port}", 2)
    if args.metrics_port is not None and not (
        0 < args.metrics_port < 65536 and args.metrics_port != args.port
    ):
        fail(f"--metrics-port must be between 1 and 65535 and differ from --port, got {args.metrics_port}", 2)
    if args.uvicorn_log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(
            f"--uvicorn-log-level {args.uvicorn_log_level!r}: use critical, error, warning, info or debug", 2
        )
    if args.max_concurrency < 1 or args.max_request_body_bytes < 1:
        fail("--max-concurrency and --max-request-body-bytes must be positive", 2)
    for key in FRAMING_KEYS:
        if not getattr(args, key) > 0:
            fail(f"--{key.replace('_', '-')} must be positive, got {getattr(args, key)}", 2)
    _check_https(args)
    with error_boundary():
        read_log_config(args.log_config_file)  # a bad file fails now, not after the model loads
    with error_boundary():
        code = run_server(EngineConfig.from_dict(engine_args), args)
    if code:
        raise typer.Exit(code)
