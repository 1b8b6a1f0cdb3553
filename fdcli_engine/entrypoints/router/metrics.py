"""One Prometheus text page from every instance's /metrics: each sample gains an `instance="URL"`
label, and the samples of one metric family stay together under one HELP and TYPE."""

from __future__ import annotations


def merge_metrics(pages: dict[str, str]) -> str:
    families: dict[str, tuple[list[str], list[str]]] = {}
    for url, text in pages.items():
        family = ""
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("# "):
                parts = line.split(None, 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    head = families.setdefault(family, ([], []))[0]
                    if not any(h.split(None, 2)[1] == parts[1] for h in head):
                        head.append(line)
                continue
            families.setdefault(family, ([], []))[1].append(_labelled(line, url))
    out = []
    for head, samples in families.values():
        out += head + samples
    return "\n".join(out) + "\n"


def _labelled(line: str, url: str) -> str:
    label = f'instance="{url}"'
    name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=len(line))
    name, rest = line[:name_end], line[name_end:]
    if rest.startswith("{}"):
        return f"{name}{{{label}}}{rest[2:]}"
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}"
    return f"{name}{{{label}}}{rest}"
