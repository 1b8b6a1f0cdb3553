"""The engine-client protocol: everything the serving layer (server, run-batch) may ask of an engine,
and the errors it raises. Implemented by AsyncLLM (engine core in its own process) and
InProcessEngineClient (engine core in this process); the serving layer depends on nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fdcli_engine.errors import FdError
from fdcli_engine.outputs import RequestOutput
from fdcli_engine.pooling_params import PoolingParams
from fdcli_engine.resolved_config import ResolvedConfig
from fdcli_engine.sampling_params import SamplingParams


class EngineDeadError(FdError):
    """The engine core is gone (its process exited, or a step failed); nothing more can be generated."""


class EngineNotReadyError(FdError):
    """The engine core is still loading the model."""


class EngineRequestError(FdError):
    """The engine failed one request for a reason that is not the client's fault."""


@dataclass
class ModelConfig:
    model: str
    served_model_name: str
    max_model_len: int
    vocab_size: int = 0
    # {SamplingParams field: value} for the fields a request leaves out (generation_config.py).
    default_sampling_params: dict = field(default_factory=dict)
    max_logprobs: int = 20  # --max-logprobs: the most (prompt_)logprobs one request may ask for


class EngineClient(Protocol):
    config: ResolvedConfig
    tokenizer: Any
    model_config: ModelConfig
    is_ready: bool  # the core has loaded the model and is not dead
    was_ready: bool  # stays True after a death: tells "died while serving" from "never started"
    dead_reason: str | None
    ready_event: asyncio.Event  # set once the core is ready or dead

    @property
    def is_dead(self) -> bool: ...

    @property
    def num_unfinished(self) -> int: ...

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        prompt: str | None = None,
        mm_features: list | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one sequence until it finishes, each as `params.output_kind` says. A consumer
        that stops early aborts the request. `mm_features`: the prompt's images, as the model's image
        processor made them (multimodal/processor.py), placeholders already expanded in the ids."""

    def encode(
        self,
        prompt_token_ids: list[int],
        pooling_params: PoolingParams,
        request_id: str,
        mm_features: list | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """One finished output whose `pooled` holds the pooled vector (or scores)."""

    def abort(self, request_id: str) -> None: ...

    def abort_all(self) -> list[str]:
        """Abort every request in flight; each stream ends with finish_reason "abort"."""

    async def start(self) -> None: ...

    async def shutdown(self, timeout: float = 5.0) -> None: ...

    async def get_stats(self) -> dict: ...

    def add_dead_listener(self, callback: Callable[[str], None]) -> None:
        """`callback(reason)` runs once, on the event loop, when the engine dies."""
