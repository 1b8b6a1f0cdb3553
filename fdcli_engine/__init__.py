"""fd's engine: `from fdcli_engine import LLM, SamplingParams, PoolingParams` (as `from vllm import ...`).

Importing this package must stay cheap and must not import paddle (the CLI imports its leaf modules).
"""

import os

from fdcli_engine.threads import usable_cpu_count  # stdlib only: no paddle

# Paddle's bootstrap sets OMP_NUM_THREADS=1 when it is unset; claim the cores before anything imports it.
os.environ.setdefault("OMP_NUM_THREADS", str(usable_cpu_count()))
# numpy's OpenBLAS threads would spin against the kernels' OpenMP threads; the engine does no numpy BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from fdcli_engine.pooling_params import PoolingParams  # noqa: E402
from fdcli_engine.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "BeamSearchParams", "PoolingParams", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":
        from fdcli_engine.api.llm import LLM

        return LLM
    if name == "BeamSearchParams":
        from fdcli_engine.beam_search import BeamSearchParams

        return BeamSearchParams
    raise AttributeError(name)
