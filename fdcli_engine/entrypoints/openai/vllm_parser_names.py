"""vLLM's `--tool-call-parser` and `--reasoning-parser` names whose formats fd does not parse, each
with the fd parser whose format is closest. A vLLM user passing one gets a one-line refusal that
says so, instead of "unknown name". Names whose format fd parses exactly are aliases in the parser
registries themselves (tool_parsers/__init__.py, reasoning.py), not here.
"""

from __future__ import annotations

# vLLM tool-call parser name -> the closest fd parser (JSON object in tags: hermes; JSON array:
# mistral; Python-call syntax: pythonic).
TOOL_PARSERS_NOT_IN_FD = {
    "apertus": "mistral",
    "cohere_command3": "hermes",
    "cohere_command4": "hermes",
    "deepseek_v32": "hermes",
    "deepseek_v4": "hermes",
    "ernie45": "ernie-x1",
    "functiongemma": "pythonic",
    "gemma4": "pythonic",
    "gigachat3": "hermes",
    "granite-20b-fc": "hermes",
    "hy_v3": "hermes",
    "inkling": "hermes",
    "kimi_k3": "hermes",
    "lfm2": "pythonic",
    "mimo": "hermes",
    "minicpm5": "hermes",
    "minimax": "hermes",
    "minimax_m3": "hermes",
    "olmo3": "pythonic",
    "openai": "hermes",
    "poolside_v1": "hermes",
    "solar_open2": "hermes",
    "step3": "hermes",
    "step3p5": "hermes",
}

# vLLM reasoning parser name -> the closest fd parser (qwen3: reasoning only inside <think>…</think>;
# deepseek_r1: text before </think> is reasoning even without <think>).
REASONING_PARSERS_NOT_IN_FD = {
    "cohere_command3": "qwen3",
    "cohere_command4": "qwen3",
    "deepseek_v3": "deepseek_r1",
    "deepseek_v4": "deepseek_r1",
    "ernie45": "ernie-x1",
    "gemma4": "qwen3",
    "glm45": "qwen3",
    "glm47": "qwen3",
    "granite": "qwen3",
    "holo2": "deepseek_r1",
    "hunyuan_a13b": "qwen3",
    "hy_v3": "qwen3",
    "inkling": "qwen3",
    "kimi_k2": "qwen3",
    "kimi_k3": "qwen3",
    "minimax_m2_append_think": "deepseek_r1",
    "minimax_m3": "deepseek_r1",
    "nemotron_v3": "deepseek_r1",
    "olmo3": "qwen3",
    "openai_gptoss": "qwen3",
    "poolside_v1": "qwen3",
    "solar_open2": "qwen3",
    "step3p5": "deepseek_r1",
}


def unknown_parser_message(flag: str, name: str, not_in_fd: dict[str, str], choices) -> str:
    """The one-line ConfigError text for a parser name fd does not have."""
    listed = ", ".join(choices)
    key = name.lower().replace("-", "_")
    closest = next((v for k, v in not_in_fd.items() if k.replace("-", "_") == key), None)
    if closest is None:
        return f"{flag} {name!r}: choose one of {listed}"
    return (
        f"{flag} {name!r}: vLLM's {name} format is not supported by fd; "
        f"the closest fd parser is {closest} (choose one of {listed})"
    )
