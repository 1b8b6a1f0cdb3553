"""`fd collect-env`: an environment report to paste into bug reports.

Invariants:
- Paddle is probed in a child process, never imported here (the CLI must not import paddle).
- Package versions come from importlib.metadata, without importing the packages.
- Nothing secret is printed: a variable whose name contains KEY/TOKEN/SECRET/PASSWORD/CREDENTIAL, or whose
  value looks like an API key (sk-..., hf_..., Bearer ...), is shown as <redacted>.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from fdcli.console import cli_errors, console

ENV_PREFIXES = (
    "FD_",
    "OMP_",
    "MKL_",
    "KMP_",
    "CUDA_",
    "PADDLE_",
    "FLAGS_",
    "HF_",
    "OPENAI_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
)
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
_SECRET_VALUE = re.compile(r"^(sk-|hf_|Bearer\s)|(://[^/\s]*:[^/\s]*@)", re.IGNORECASE)
REDACTED = "<redacted>"
CPU_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "neon",
    "asimd",
    "sve",
)
PACKAGES = (
    "fd-llm",
    "paddlepaddle",
    "paddlepaddle-gpu",
    "numpy",
    "tokenizers",
    "transformers",
    "torch",
    "safetensors",
    "gguf",
    "jinja2",
    "typer",
    "rich",
    "httpx",
    "fastapi",
    "uvicorn",
    "uvloop",
    "httptools",
    "pydantic",
    "pyzmq",
    "msgspec",
    "openai",
    "psutil",
)


def redact_env(environ: dict[str, str]) -> dict[str, str]:
    """The relevant variables (by prefix), with anything that looks secret replaced by <redacted>."""
    out = {}
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIXES):
            continue
        value = environ[name]
        secret = _SECRET_NAME.search(name) or _SECRET_VALUE.search(value.strip())
        out[name] = REDACTED if secret else value
    return out


def _cpu_info() -> dict[str, Any]:
    info: dict[str, Any] = {"machine": platform.machine(), "model": platform.processor() or "unknown"}
    flags: set[str] = set()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model") and info["model"] in ("unknown", platform.machine(), ""):
            info["model"] = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    info["flags"] = {f: f in flags for f in CPU_FLAGS} if flags else "unknown (no /proc/cpuinfo)"
    info["logical_cores"] = os.cpu_count()
    try:
        info["usable_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["usable_cores"] = os.cpu_count()
    try:
        import psutil

        info["physical_cores"] = psutil.cpu_count(logical=False)
    except ImportError:
        pass
    return info


def _memory() -> dict[str, Any]:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total_gib": round(vm.total / 2**30, 2), "available_gib": round(vm.available / 2**30, 2)}
    except ImportError:
        return {"total_gib": "unknown"}


def _os_info() -> dict[str, Any]:
    pretty = None
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                pretty = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "distribution": pretty or platform.system(),
        "kernel": platform.release(),
    }


def _packages() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


# Runs in a child process: the CLI never imports paddle (import-linter contract), a broken paddle install
# (missing shared library, crash on import) is reported instead of taking the report down, and paddle's
# import-time rewrite of OMP_NUM_THREADS and its warnings stay out of this process.
_PADDLE_PROBE = """
import json, warnings
warnings.simplefilter("ignore")
import paddle
v = paddle.version
info = {"version": paddle.__version__, "commit": getattr(v, "commit", "unknown"),
        "compiled_with_cuda": bool(paddle.is_compiled_with_cuda())}
for attr in ("cuda", "cudnn", "with_mkl"):
    fn = getattr(v, attr, None)
    if fn is not None:
        try:
            info[attr] = str(fn() if callable(fn) else fn)
        except Exception as exc:
            info[attr] = "unknown (%s)" % exc
try:
    info["device"] = paddle.device.get_device()
except Exception as exc:
    info["device"] = "unknown (%s)" % exc
try:  # fd's CPU kernels: the level this process runs, only where they are built (a build takes minutes)
    from fd_kernels import build, native
    info["fd_kernels"] = ("%s (GGUF rows: %s)" % (native.active_isa(), native.qgemm_path()) if build.is_built()
                          else "not built yet (the first engine start compiles them)")
except Exception as exc:
    info["fd_kernels"] = "unavailable (%s)" % exc
print("FD_PADDLE_INFO=" + json.dumps(info))
"""


def _paddle_info() -> dict[str, Any]:
    """Paddle's version and build, probed in a child process; never raises."""
    try:
        res = subprocess.run(
            [sys.executable, "-c", _PADDLE_PROBE], capture_output=True, text=True, timeout=180, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"paddle probe failed: {exc}"}
    for line in res.stdout.splitlines():
        if line.startswith("FD_PADDLE_INFO="):
            return json.loads(line.split("=", 1)[1])
    last = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
    return {"error": f"import paddle failed: {last[:300]}"}


def _gpus() -> list[str] | str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none (nvidia-smi not found)"
    try:
        res = subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if res.returncode != 0:
        return f"nvidia-smi failed: {res.stderr.strip()[:200]}"
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def collect(include_paddle: bool = True) -> dict[str, Any]:
    env = redact_env(dict(os.environ))  # before paddle: its import rewrites OMP_NUM_THREADS
    paddle = _paddle_info() if include_paddle else {"skipped": True}
    # The kernels' level (fd_kernels.native.active_isa: amx, avx512bf16, avx512, avx2, scalar), from the probe.
    kernels = paddle.pop("fd_kernels", "not probed (--no-paddle)" if not include_paddle else "unknown")
    return {
        "os": _os_info(),
        "cpu": _cpu_info(),
        "memory": _memory(),
        "python": {
            "version": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "paddle": paddle,
        "kernels": kernels,
        "gpus": _gpus(),
        "packages": _packages(),
        "env": env,
    }


def _render(report: dict[str, Any]) -> None:
    from rich.table import Table

    for section, body in report.items():
        table = Table(title=section, title_justify="left", show_header=False, min_width=40)
        table.add_column("key", style="bold")
        table.add_column("value", overflow="fold")
        if isinstance(body, dict):
            rows = body.items()
        elif isinstance(body, list):
            rows = ((str(i), v) for i, v in enumerate(body))
        else:
            rows = [("", body)]
        for key, value in rows:
            if isinstance(value, dict):
                value = (
                    " ".join(k for k, on in value.items() if on)
                    if all(isinstance(x, bool) for x in value.values())
                    else json.dumps(value)
                )
            table.add_row(str(key), str(value))
        if isinstance(body, dict) and not body:
            table.add_row("-", "(none set)")
        console.print(table, markup=False, highlight=False)


@cli_errors
def collect_env(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    no_paddle: Annotated[bool, typer.Option("--no-paddle", help="Do not import paddle (faster).")] = False,
) -> None:
    """Print the environment (OS, CPU, Python, Paddle, packages, env vars) for bug reports."""
    report = collect(include_paddle=not no_paddle)
    if json_out:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        _render(report)
