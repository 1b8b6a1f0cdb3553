"""ERNIE-4.5-VL's image processor, written for fd (transformers' `Ernie4_5_VLMoeImageProcessor` and
the token expansion of `Ernie4_5_VLMoeProcessor` are the reference the tests compare with).

Pixels: `smart_resize` to multiples of patch_size * merge_size (28) within [min_pixels, max_pixels]
(defaults 56*56 and 28*28*6177), bicubic, CLIP mean/std, 14x14 patches with one temporal slice, so a
patch row is 3 * 14 * 14 = 588 floats and grid_thw = [1, H/14, W/14].

Tokens: ERNIE's chat template writes each image as `<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>`
(config.json: image_start_token_id, image_token_id, image_end_token_id). Each single placeholder is
expanded to h * w / merge_size**2 placeholders, one per LLM token the resampler produces. The start
and end tokens stay ordinary prompt tokens; the model routes them to its vision experts itself.
"""

from __future__ import annotations

import hashlib

from PIL import Image

from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.inputs import MultiModalFeature
from fdcli_engine.multimodal.patches import patchify, resize_normalize, smart_resize, to_rgb

DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 6177
# transformers' ERNIE-4.5-VL config defaults for the token ids a config.json may leave out.
DEFAULT_TOKEN_IDS = {"image_token_id": 100295, "image_start_token_id": 101304, "image_end_token_id": 101305}
KWARGS = ("min_pixels", "max_pixels", "size")


def image_content_hash(image: Image.Image) -> str:
    """hex sha256 over mode, size and the RGB pixel bytes (media's LoadedImage.content_hash rule)."""
    rgb = to_rgb(image)
    h = hashlib.sha256()
    h.update(f"{rgb.mode}:{rgb.size[0]}x{rgb.size[1]}:".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


def _pixel_budget(base: tuple[int, int], kwargs: dict | None) -> tuple[int, int]:
    """(min_pixels, max_pixels) after `mm_processor_kwargs` (FastDeploy's min_pixels / max_pixels, or
    transformers' size={shortest_edge, longest_edge}); an unknown key or a bad value is a 400."""
    min_pixels, max_pixels = base
    for key, value in (kwargs or {}).items():
        if key not in KWARGS:
            raise InvalidRequestError(
                f"mm_processor_kwargs: unknown key {key!r} for ERNIE-4.5-VL; supported: {', '.join(KWARGS)}",
                param="mm_processor_kwargs",
            )
        if key == "size":
            if not isinstance(value, dict) or not set(value) <= {"shortest_edge", "longest_edge"}:
                raise InvalidRequestError(
                    "mm_processor_kwargs.size must be an object with shortest_edge and/or longest_edge",
                    param="mm_processor_kwargs",
                )
            min_pixels = value.get("shortest_edge", min_pixels)
            max_pixels = value.get("longest_edge", max_pixels)
        elif key == "min_pixels":
            min_pixels = value
        else:
            max_pixels = value
    for name, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise InvalidRequestError(
                f"mm_processor_kwargs: {name} must be a positive integer", param="mm_processor_kwargs"
            )
    if min_pixels > max_pixels:
        raise InvalidRequestError(
            "mm_processor_kwargs: min_pixels is larger than max_pixels", param="mm_processor_kwargs"
        )
    return min_pixels, max_pixels


class Ernie4_5_VLImageProcessor:
    modality = "image"

    def __init__(
        self, hf_config: dict, min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS
    ):
        vision = hf_config.get("vision_config") or {}
        self.patch_size = int(vision.get("patch_size", 14))
        self.merge_size = int(vision.get("spatial_merge_size", 2))
        self.temporal_patch_size = 1
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        ids = {k: int(hf_config.get(k, v)) for k, v in DEFAULT_TOKEN_IDS.items()}
        self.image_token_id = ids["image_token_id"]
        self.image_start_token_id = ids["image_start_token_id"]
        self.image_end_token_id = ids["image_end_token_id"]

    def preprocess(self, image: Image.Image, mm_processor_kwargs: dict | None = None):
        """(pixel rows float32 [h * w, 588], grid_thw [1, h, w]) of one picture."""
        min_pixels, max_pixels = _pixel_budget((self.min_pixels, self.max_pixels), mm_processor_kwargs)
        factor = self.patch_size * self.merge_size
        try:
            height, width = smart_resize(image.height, image.width, factor, min_pixels, max_pixels)
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param="messages") from None
        pixels = resize_normalize(image, height, width)
        rows = patchify(pixels, self.patch_size, self.merge_size, self.temporal_patch_size)
        return rows, [1, height // self.patch_size, width // self.patch_size]

    def num_tokens(self, grid_thw: list[int]) -> int:
        t, h, w = grid_thw
        return t * h * w // (self.merge_size**2)

    def process(
        self, prompt_token_ids: list[int], images: list, mm_processor_kwargs: dict | None = None
    ) -> tuple[list[int], list[MultiModalFeature]]:
        """Expand each image placeholder to its token count; one feature per image, in prompt order."""
        slots = [i for i, t in enumerate(prompt_token_ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise InvalidRequestError(
                f"the prompt has {len(slots)} image placeholder(s) but {len(images)} image(s) were given",
                param="messages",
            )
        ids: list[int] = []
        features: list[MultiModalFeature] = []
        start = 0
        for slot, item in zip(slots, images, strict=True):
            picture = getattr(item, "image", item)
            content_hash = getattr(item, "content_hash", None) or image_content_hash(picture)
            rows, grid = self.preprocess(picture, mm_processor_kwargs)
            ids.extend(prompt_token_ids[start:slot])
            length = self.num_tokens(grid)
            features.append(
                MultiModalFeature.from_pixels("image", content_hash, len(ids), length, rows, grid)
            )
            ids.extend([self.image_token_id] * length)
            start = slot + 1
        ids.extend(prompt_token_ids[start:])
        return ids, features
