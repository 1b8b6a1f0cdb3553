"""One image of a request, as the front end hands it to the engine (in-process or over the socket).

A feature owns a contiguous range of placeholder tokens in the prompt: prompt_token_ids[offset :
offset + length] are the image's placeholder ids, whose embeddings the runner replaces with the
vision encoder's output rows (one row per placeholder). `content_hash` identifies the picture's
content (not its encoding); prefix hashing folds it into every block the range overlaps.
"""

from __future__ import annotations

import msgspec
import numpy as np


class MultiModalFeature(msgspec.Struct, omit_defaults=True):
    modality: str  # "image"
    content_hash: str
    offset: int  # index in prompt_token_ids of the first placeholder token
    length: int  # number of placeholder tokens
    pixel_values: bytes  # float32, C order, shaped pixel_shape
    pixel_shape: list[int]
    grid_thw: list[int]  # [t, h, w] in patches
    extra: dict[str, list[int]] = {}  # model-specific small data

    @property
    def end(self) -> int:
        """One past the last placeholder position."""
        return self.offset + self.length

    def pixels(self) -> np.ndarray:
        """The pixel values as a float32 array (a read-only view of the bytes)."""
        return np.frombuffer(self.pixel_values, dtype=np.float32).reshape(self.pixel_shape)

    @classmethod
    def from_pixels(cls, modality: str, content_hash: str, offset: int, length: int, pixels, grid_thw, **kw):
        arr = np.ascontiguousarray(pixels, dtype=np.float32)
        return cls(
            modality,
            content_hash,
            offset,
            length,
            arr.tobytes(),
            list(arr.shape),
            [int(g) for g in grid_thw],
            **kw,
        )
