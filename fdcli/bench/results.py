"""Result files: stable JSON for `--save-result`, loading, and the side-by-side comparison data.

Schema `fd-bench/1`: top-level keys schema, kind, date, fd_version, config, metrics, and `requests`
only with --save-detailed. `config` holds every effective option (defaults included) with header values
and the API key redacted, so a result file can be shared. `fd bench serve` adds vLLM's flat result keys
at the top level (see vllm_result.py); its `date` is then vLLM's `YYYYmmdd-HHMMSS`.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from fdcli.bench.metrics import RequestRecord
from fdcli_engine.errors import ConfigError

SCHEMA = "fd-bench/1"
REDACTED = "<redacted>"
RESULT_KEYS = ("schema", "kind", "date", "fd_version", "config", "metrics")
SKIP_COMPARE = {"throughput_series", "errors", "goodput_slo_ms", "output_tokens_source", "itl_mode"}


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return dict.fromkeys(headers, REDACTED)


def _fd_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fd-llm")
    except PackageNotFoundError:
        return "unknown"


def record_to_dict(r: RequestRecord, bench_start: float) -> dict:
    def ms(v):
        return None if v is None else v * 1000.0

    return {
        "index": r.index,
        "ok": r.ok,
        "error": r.error or None,
        "prompt_len": r.prompt_len,
        "output_tokens": r.output_tokens,
        "output_tokens_source": r.output_tokens_source or None,
        "start_s": r.start - bench_start,
        "ttft_ms": ms(r.ttft),
        "tpot_ms": ms(r.tpot),
        "e2el_ms": ms(r.e2el),
        "chunk_times_s": [t - bench_start for t in r.chunk_times],
        "chunk_tokens": r.chunk_tokens,
        "generated_text": r.generated_text,
    }


def build_result(kind: str, config: dict, metrics: dict, requests: list[dict] | None = None) -> dict:
    result = {
        "schema": SCHEMA,
        "kind": kind,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "fd_version": _fd_version(),
        "config": config,
        "metrics": metrics,
    }
    if requests is not None:
        result["requests"] = requests
    return result


def _json_safe(value):
    """inf/nan are not JSON: write them as strings ("inf") rather than emit invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def save_result(path: str | Path, result: dict, append: bool = False) -> None:
    """Write `result` as indented JSON, or with `append` as one more line of a JSON-lines file (vLLM's
    --append-result)."""
    try:
        if append:
            with Path(path).open("a", encoding="utf-8") as f:
                f.write(json.dumps(_json_safe(result)) + "\n")
            return
        Path(path).write_text(json.dumps(_json_safe(result), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write --save-result {str(path)!r}: {exc.strerror or exc}") from None


def _json_documents(path: str | Path) -> list:
    """The file as one JSON document, or as JSON lines (what --append-result writes, fd's and vLLM's)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{str(path)!r} is not a JSON file: {exc}") from None
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as whole_exc:
        lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        if len(lines) < 2:
            raise ConfigError(f"{str(path)!r} is not a JSON file: {whole_exc}") from None
        docs = []
        for n, line in lines:
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{str(path)}:{n}: not a JSON object per line: {exc}") from None
        return docs


def _as_run(path: str | Path, data) -> dict:
    """fd's result as is; a `vllm bench` result (flat keys) with fd's kind and metrics made from them."""
    from fdcli.bench.vllm_result import metrics_from_vllm

    if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
        return data
    found = metrics_from_vllm(data) if isinstance(data, dict) else None
    if found is None:
        raise ConfigError(
            f"{str(path)!r} is neither an fd bench result (no 'metrics' object) nor a vllm bench result"
        )
    kind, metrics = found
    return {**data, "kind": kind, "metrics": metrics}


def load_results(path: str | Path) -> list[dict]:
    """Every run in the file: one, or one per line of an --append-result file."""
    return [_as_run(path, doc) for doc in _json_documents(path)]


def flatten_metrics(metrics: dict) -> dict[str, float]:
    """Numeric metrics as `name` or `group.name` (e.g. `ttft.p99_ms`), in file order."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if key in SKIP_COMPARE:
            continue
        if isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    flat[f"{key}.{sub}"] = v
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[key] = value  # ints stay ints so counts print as counts
    return flat


def compare_rows(results: list[dict]) -> list[tuple[str, list[float | None], list[float | None]]]:
    """Rows (metric, values per run, ratio of each run to the first); metrics in the first run's order."""
    flats = [flatten_metrics(r["metrics"]) for r in results]
    names: list[str] = []
    for flat in flats:
        names.extend(n for n in flat if n not in names)
    rows = []
    for name in names:
        values = [f.get(name) for f in flats]
        base = values[0]
        ratios = [None if v is None or not base else v / base for v in values]
        rows.append((name, values, ratios))
    return rows
