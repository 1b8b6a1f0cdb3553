"""The engine API the entry points use: `LLM` (offline, in-process). Imported lazily."""


def __getattr__(name: str):
    if name == "LLM":
        from fdcli_engine.api.llm import LLM

        return LLM
    raise AttributeError(name)
