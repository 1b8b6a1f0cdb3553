"""The pixel pipeline the Qwen2-VL family of vision towers shares (Qwen2-VL, Qwen2.5-VL, ERNIE-4.5-VL):
resize to a multiple of patch_size * merge_size within a pixel budget, rescale to [0, 1], normalize
per channel, and cut into flattened patches in merge-window order.

Patch order: the rows of an image's patch matrix walk the merge windows row-major, and inside each
window its merge_size x merge_size patches row-major, so the vision tower's merger can fold every
consecutive merge_size**2 rows into one LLM token. Each row is (channel, temporal, patch_h, patch_w)
flattened; a still image repeats its one frame `temporal_patch_size` times.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

# OpenAI CLIP's per-channel mean and std, the normalization both families train with.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, scaled (aspect ratio kept as near as the
    rounding allows) so that height * width lies within [min_pixels, max_pixels]. ValueError for an
    aspect ratio over 200."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"image aspect ratio {max(height, width) / min(height, width):.0f} is over 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (what the models saw in training)."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def resize_normalize(image: Image.Image, height: int, width: int, mean=CLIP_MEAN, std=CLIP_STD) -> np.ndarray:
    """The RGB image resized (bicubic, on 8-bit pixels) to height x width, scaled to [0, 1] and
    normalized per channel: float32 [3, height, width]."""
    rgb = to_rgb(image)
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(rgb, dtype=np.float32) * np.float32(1 / 255)
    pixels = (pixels - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def patchify(image: np.ndarray, patch_size: int, merge_size: int, temporal_patch_size: int) -> np.ndarray:
    """[C, H, W] (H, W multiples of patch_size * merge_size) -> [(H/ps) * (W/ps), C * T * ps * ps] in
    merge-window order (module docstring)."""
    channels, height, width = image.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    p = image.reshape(
        channels, grid_h // merge_size, merge_size, patch_size, grid_w // merge_size, merge_size, patch_size
    )
    p = p.transpose(1, 4, 2, 5, 0, 3, 6)  # windows h, w; inside-window h, w; channel; patch h, w
    p = np.broadcast_to(p[:, :, :, :, :, None], (*p.shape[:5], temporal_patch_size, *p.shape[5:]))
    return np.ascontiguousarray(
        p.reshape(grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size)
    )
