"""ERNIE-4.5-VL's image processor (transformers' `Ernie4_5_VLMoeImageProcessor` and the token expansion
of `Ernie4_5_VLMoeProcessor` are the reference the tests compare with).

The pixel pipeline is Qwen2-VL's (qwen2_vl_processor.py: smart_resize to multiples of 28 within
[min_pixels, max_pixels], bicubic, CLIP mean/std, merge-block patch order) with two differences:
one temporal slice per patch (a row is 3 * 14 * 14 = 588 floats) and a larger default budget
(max_pixels 28 * 28 * 6177).

Tokens: ERNIE's chat template writes each image as `<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>`
(config.json: image_start_token_id, image_token_id, image_end_token_id). Each placeholder becomes
grid_h * grid_w / merge_size**2 placeholders; start and end stay ordinary prompt tokens, which the
model itself sends to its vision experts.
"""

from __future__ import annotations

from fdcli_engine.multimodal.qwen2_vl_processor import Qwen2VLImageProcessor

DEFAULT_MAX_PIXELS = 28 * 28 * 6177
DEFAULT_IMAGE_TOKEN_ID = 100295  # transformers' Ernie4_5_VLMoeConfig default


class Ernie4_5_VLImageProcessor(Qwen2VLImageProcessor):
    """ImageProcessor (multimodal/processor.py) for Ernie4_5_VLMoeForConditionalGeneration."""

    def __init__(self, hf_config: dict, preprocessor_config: dict | None = None):
        pre = preprocessor_config or {}
        super().__init__(hf_config, pre)
        self.temporal_patch_size = 1
        if not (pre.get("max_pixels") or (pre.get("size") or {}).get("longest_edge")):
            self.max_pixels = DEFAULT_MAX_PIXELS
        self.image_token_id = int(hf_config.get("image_token_id", DEFAULT_IMAGE_TOKEN_ID))
