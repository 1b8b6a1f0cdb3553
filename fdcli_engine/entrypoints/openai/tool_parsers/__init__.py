"""Tool-call parsers, selected by `--tool-call-parser`: turn a model's raw output into OpenAI
`tool_calls` plus the remaining content.

A parser class has `extract(text) -> ParsedOutput` (parsed_output.py), `start_tag` (the text that opens a call:
streamed content is held back from there), `tags` (every tag of its format: a streamed tail that
could grow into one is held back) and `new_id()` (a tool-call id in the format's own shape).
`reads_answer = True`: it is given the answer after the reasoning block, and `call_start(text)` says
where its calls begin (-1: none). A JSON-argument format streams its arguments as they grow: its
`calls_region(text)` is the text its `new_scanner()` (json_scan.py; reparse_scan.py for other formats)
reads; without these methods the calls are sent whole when the output ends (serving_tools.py).
`reads_tools = True`: it is built with the request's tools (`cls(tools)`), whose schemas type the
values it reads.
"""

from __future__ import annotations

from fdcli_engine.entrypoints.openai.tool_parsers.deepseek_v3 import (
    DeepSeekV3ToolParser,
    DeepSeekV31ToolParser,
)
from fdcli_engine.entrypoints.openai.tool_parsers.ernie_x1 import ErnieX1ToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.glm4_moe import Glm4MoeToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.granite import GraniteToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.hermes import HermesToolParser, LongcatToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.internlm2 import InternLM2ToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.jamba import JambaToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.kimi_k2 import KimiK2ToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.minimax_m2 import MinimaxM2ToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.phi4_mini_json import Phi4MiniJsonToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.qwen3_coder import Qwen3CoderToolParser, SeedOssToolParser
from fdcli_engine.entrypoints.openai.tool_parsers.xlam import XLamToolParser

TOOL_PARSERS = {
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "ernie_x1": ErnieX1ToolParser,
    "glm45": Glm4MoeToolParser,
    "granite": GraniteToolParser,
    "hermes": HermesToolParser,
    "internlm": InternLM2ToolParser,
    "jamba": JambaToolParser,
    "kimi_k2": KimiK2ToolParser,
    "llama3_json": Llama3JsonToolParser,
    "longcat": LongcatToolParser,
    "minimax_m2": MinimaxM2ToolParser,
    "mistral": MistralToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
    "pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "seed_oss": SeedOssToolParser,
    "xlam": XLamToolParser,
    # vLLM's names for formats above: llama4_json is vLLM's Llama3JsonToolParser itself; llama4_pythonic
    # is the pythonic list, optionally in <|python_start|>…<|python_end|>; granite4 writes hermes'
    # <tool_call>{json}</tool_call> blocks; hunyuan_a13b writes jamba's <tool_calls>[…]</tool_calls>.
    "llama4_json": Llama3JsonToolParser,
    "llama4_pythonic": PythonicToolParser,
    "granite4": HermesToolParser,
    "hunyuan_a13b": JambaToolParser,
    # vLLM's glm47 reads GLM-4.5's blocks with the name ending at <arg_key> too (fd's glm45 does so).
    "glm47": Glm4MoeToolParser,
    # vLLM's qwen3_xml reads the same Qwen3-Coder XML with an XML streaming parser.
    "qwen3_xml": Qwen3CoderToolParser,
}

# The names users know: FastDeploy's "ernie-x1", vLLM's others.
PARSER_NAMES = (
    "deepseek_v3",
    "deepseek_v31",
    "ernie-x1",
    "glm45",
    "glm47",
    "granite",
    "granite4",
    "hermes",
    "hunyuan_a13b",
    "internlm",
    "jamba",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "llama4_pythonic",
    "longcat",
    "minimax_m2",
    "mistral",
    "phi4_mini_json",
    "pythonic",
    "qwen3_coder",
    "qwen3_xml",
    "seed_oss",
    "xlam",
)

__all__ = [
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "PARSER_NAMES",
    "TOOL_PARSERS",
    "ErnieX1ToolParser",
    "Glm4MoeToolParser",
    "GraniteToolParser",
    "HermesToolParser",
    "InternLM2ToolParser",
    "JambaToolParser",
    "KimiK2ToolParser",
    "Llama3JsonToolParser",
    "LongcatToolParser",
    "MinimaxM2ToolParser",
    "MistralToolParser",
    "Phi4MiniJsonToolParser",
    "PythonicToolParser",
    "Qwen3CoderToolParser",
    "SeedOssToolParser",
    "XLamToolParser",
    "get_tool_parser_cls",
]


def get_tool_parser_cls(name: str | None):
    if not name:
        return None
    try:
        return TOOL_PARSERS[name.replace("-", "_").lower()]
    except KeyError:
        from fdcli_engine.entrypoints.openai.vllm_parser_names import (  # noqa: PLC0415
            TOOL_PARSERS_NOT_IN_FD,
            unknown_parser_message,
        )
        from fdcli_engine.errors import ConfigError  # noqa: PLC0415

        message = unknown_parser_message("--tool-call-parser", name, TOOL_PARSERS_NOT_IN_FD, PARSER_NAMES)
        raise ConfigError(message) from None
