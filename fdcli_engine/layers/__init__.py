"""Model building blocks: plain Python classes holding Paddle tensors (no nn.Layer call overhead),
calling ops through `fdcli_engine.ops` so `ops.use()` switches reference and native kernels."""

from fdcli_engine.layers.activation import GatedMLP
from fdcli_engine.layers.attention import Attention
from fdcli_engine.layers.embedding import LMHead, VocabEmbedding
from fdcli_engine.layers.linear import Linear, MergedLinear
from fdcli_engine.layers.norm import RMSNorm
from fdcli_engine.layers.rotary import RotaryEmbedding

__all__ = [
    "Attention",
    "GatedMLP",
    "LMHead",
    "Linear",
    "MergedLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "VocabEmbedding",
]
