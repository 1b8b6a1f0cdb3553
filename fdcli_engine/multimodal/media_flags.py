"""vLLM's --allowed-local-media-path and --allowed-media-domains (`fd serve`, `fd run-batch`, and
`LLM(allowed_local_media_path=..., allowed_media_domains=...)`) as the MediaPolicy image URLs are
loaded under (multimodal/media.py). Checked before the model loads.

Leaf module: imports the errors and media only.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from fdcli_engine.errors import ConfigError
from fdcli_engine.multimodal.media import MediaPolicy


def policy_from_flags(local: str | None, domains: list[str] | tuple[str, ...] | None) -> MediaPolicy:
    """The policy: files under `local` (a folder), http(s) from the hosts in `domains` (each item may
    hold several, comma-separated); a ConfigError for a bad value."""
    if local is not None and not Path(local).expanduser().is_dir():
        raise ConfigError(f"--allowed-local-media-path {local!r} is not a folder")
    if isinstance(domains, str):
        domains = [domains]
    hosts = tuple(d.strip().lower() for item in domains or () for d in item.split(",") if d.strip())
    for d in hosts:
        if "/" in d or "@" in d or (":" in d and not _is_ipv6(d)):
            raise ConfigError(
                f"--allowed-media-domains takes host names (no scheme, port or path), got {d!r}"
            )
    return MediaPolicy(
        allowed_local_path=str(Path(local).expanduser().resolve()) if local is not None else None,
        allowed_domains=hosts,
    )


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host.strip("[]"))
    except ValueError:
        return False
    return True
