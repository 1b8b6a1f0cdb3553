"""Qwen2-VL / Qwen2.5-VL image processing, written for fd (transformers' Qwen2VLImageProcessor is the
reference the tests compare with).

A picture is resized (bicubic, Pillow) to the nearest size whose sides are multiples of
patch_size * merge_size and whose area lies in [min_pixels, max_pixels], scaled to [0, 1], normalized
with the CLIP mean/std, and cut into patches: one row per patch of C * T * P * P values (the still
image repeated T = temporal_patch_size times), rows ordered merge-block by merge-block, so each group
of merge^2 consecutive rows becomes one token after the vision tower's patch merger. In the prompt,
each `<|image_pad|>` the chat template wrote becomes grid_t * grid_h * grid_w / merge^2 of them.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.image_check import to_rgb
from fdcli_engine.multimodal.image_input import as_loaded
from fdcli_engine.multimodal.inputs import MultiModalFeature

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200
# mm_processor_kwargs: transformers' pixel budget, and FastDeploy's image_size (a side length: the
# picture is resized to about image_size x image_size pixels of area, aspect ratio kept).
KWARGS = ("min_pixels", "max_pixels", "image_size")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width), both multiples of `factor`, area within [min_pixels, max_pixels], aspect ratio
    kept as closely as those allow."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"the image's aspect ratio exceeds {MAX_ASPECT_RATIO}:1")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def patchify(image: np.ndarray, patch: int, merge: int, temporal: int) -> np.ndarray:
    """[C, H, W] float32 -> [grid_h * grid_w, C * temporal * patch * patch], rows in merge-block order
    (block row, block column, row inside the block, column inside the block)."""
    c, height, width = image.shape
    gh, gw = height // patch, width // patch
    x = image.reshape(c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(1, 4, 2, 5, 0, 3, 6)  # blocks h, w; inside h, w; C; pixel rows, columns
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], temporal, patch, patch))
    return np.ascontiguousarray(x.reshape(gh * gw, c * temporal * patch * patch))


class Qwen2VLImageProcessor:
    """ImageProcessor (multimodal/processor.py) for Qwen2-VL and Qwen2.5-VL checkpoints."""

    def __init__(self, hf_config: dict, preprocessor_config: dict | None = None):
        vision = hf_config.get("vision_config") or {}
        pre = preprocessor_config or {}
        self.patch_size = int(pre.get("patch_size") or vision.get("patch_size") or 14)
        self.merge_size = int(pre.get("merge_size") or vision.get("spatial_merge_size") or 2)
        self.temporal_patch_size = int(
            pre.get("temporal_patch_size") or vision.get("temporal_patch_size") or 2
        )
        size = pre.get("size") or {}
        self.min_pixels = int(pre.get("min_pixels") or size.get("shortest_edge") or 56 * 56)
        self.max_pixels = int(pre.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280)
        self.mean = np.asarray(pre.get("image_mean") or CLIP_MEAN, dtype=np.float32)
        self.std = np.asarray(pre.get("image_std") or CLIP_STD, dtype=np.float32)
        self.image_token_id = int(hf_config.get("image_token_id", 151655))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def _pixel_range(self, kwargs: dict | None) -> tuple[int, int]:
        kwargs = kwargs or {}
        unknown = sorted(set(kwargs) - set(KWARGS))
        if unknown:
            raise InvalidRequestError(
                f"mm_processor_kwargs: unknown key(s) {unknown}; this model's image processor takes "
                f"{', '.join(KWARGS)}",
                param="mm_processor_kwargs",
            )
        for name in KWARGS:
            v = kwargs.get(name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise InvalidRequestError(
                    f"mm_processor_kwargs.{name} must be a positive integer", param="mm_processor_kwargs"
                )
        lo, hi = kwargs.get("min_pixels", self.min_pixels), kwargs.get("max_pixels", self.max_pixels)
        if kwargs.get("image_size") is not None:
            lo = hi = kwargs["image_size"] ** 2
        if lo > hi:
            raise InvalidRequestError(
                "mm_processor_kwargs: min_pixels exceeds max_pixels", param="mm_processor_kwargs"
            )
        # The most a single image may become: the model's own max_pixels (a request cannot raise it).
        return lo, min(hi, self.max_pixels)

    def pixel_values(
        self, image: Image.Image, min_pixels: int, max_pixels: int
    ) -> tuple[np.ndarray, list[int]]:
        """(rows [num_patches, C*T*P*P] float32, grid_thw) of one picture."""
        rgb = to_rgb(image)
        try:
            h, w = smart_resize(rgb.height, rgb.width, self.factor, min_pixels, max_pixels)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="image") from None
        if (h, w) != (rgb.height, rgb.width):
            rgb = rgb.resize((w, h), resample=Image.Resampling.BICUBIC)
        x = (np.asarray(rgb, dtype=np.float64) * (1 / 255)).astype(np.float32)  # [H, W, C]
        x = ((x - self.mean) / self.std).transpose(2, 0, 1)
        rows = patchify(
            np.ascontiguousarray(x, dtype=np.float32),
            self.patch_size,
            self.merge_size,
            self.temporal_patch_size,
        )
        return rows, [1, h // self.patch_size, w // self.patch_size]

    def num_tokens(self, grid_thw: list[int]) -> int:
        t, h, w = grid_thw
        return t * h * w // (self.merge_size**2)

    def process(self, prompt_token_ids: list[int], images: list, mm_processor_kwargs: dict | None = None):
        """(expanded prompt ids, one MultiModalFeature per image): each image placeholder token, in
        order, becomes the image's run of placeholder tokens."""
        lo, hi = self._pixel_range(mm_processor_kwargs)
        slots = [i for i, t in enumerate(prompt_token_ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise InvalidRequestError(
                f"the prompt has {len(slots)} image placeholder(s) but {len(images)} image(s) were given",
                param="messages",
            )
        out: list[int] = []
        features: list[MultiModalFeature] = []
        prev = 0
        for slot, item in zip(slots, images):
            image, content_hash = as_loaded(item)
            rows, grid = self.pixel_values(image, lo, hi)
            n = self.num_tokens(grid)
            out.extend(prompt_token_ids[prev:slot])
            features.append(MultiModalFeature.from_pixels("image", content_hash, len(out), n, rows, grid))
            out.extend([self.image_token_id] * n)
            prev = slot + 1
        out.extend(prompt_token_ids[prev:])
        return out, features
