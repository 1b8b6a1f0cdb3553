"""The row layout of the fused sampler's inputs, written once for Python: the C++ side mirrors it in
csrc/sampler.h (enums SampleParam and SampleMeta, in this order; tests/kernels/test_sampler_layout.py
checks the two agree). The model runner fills rows in this layout, the native sampler and its reference
(fd_kernels.reference.sampler) read them.

params float64 [B, len(PARAM_COLUMNS)]: one row per sequence; the column names are SamplingParams fields.
meta int64 [B, len(META_COLUMNS)]: row b's ids are ids[offset : offset + num_prompt + num_output +
num_banned] (prompt ids, output ids, banned ids).
"""

from collections import namedtuple

PARAM_COLUMNS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
META_COLUMNS = ("offset", "num_prompt", "num_output", "num_banned")

# One row of each array by name, in the layout's order: ParamRow(*params[b]).top_p, or
# MetaRow(offset=..., num_prompt=..., ...) to fill a row without restating the order.
ParamRow = namedtuple("ParamRow", PARAM_COLUMNS)
MetaRow = namedtuple("MetaRow", META_COLUMNS)
