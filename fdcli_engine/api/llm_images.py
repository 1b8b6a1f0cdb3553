"""Images for the offline LLM, as vLLM's offline API takes them.

- `LLM.generate({"prompt": ..., "multi_modal_data": {"image": PIL | [PIL, ...]}, "mm_processor_kwargs":
  {...}})`: the prompt holds one image placeholder per picture, as the model's chat template writes it
  (Qwen: `<|vision_start|><|image_pad|><|vision_end|>`).
- `LLM.chat` messages with `{"type": "image_url", "image_url": {"url": ...}}` parts (or `input_image`,
  its `image_url` the URL string), the url a `data:`
  URL (or a file / http(s) URL within `media_policy`) or a PIL image, and vLLM's `{"type":
  "image_pil", "image_pil": PIL}`: each becomes `{"type": "image"}` for the chat template.
Pictures are decoded and checked by multimodal.media; the model's image processor expands the
placeholders and makes the features.
"""

from __future__ import annotations

from PIL import Image

from fdcli_engine.multimodal.content_parts import IMAGE_URL_PARTS
from fdcli_engine.multimodal.media import MediaPolicy, load_image

IMAGE_PART_TYPES = (*IMAGE_URL_PARTS, "image_pil")


def images_of(multi_modal_data, where: str) -> list:
    """The pictures of a vLLM `multi_modal_data` dict ({"image": one or a list})."""
    if not isinstance(multi_modal_data, dict):
        raise TypeError(f"{where}: 'multi_modal_data' must be a dict such as {{'image': PIL image}}")
    other = sorted(set(multi_modal_data) - {"image"})
    if other:
        raise ValueError(f"{where}: 'multi_modal_data' {other}: only images are supported")
    images = multi_modal_data.get("image")
    images = images if isinstance(images, (list, tuple)) else [images]
    for img in images:
        if not isinstance(img, Image.Image) and not hasattr(img, "content_hash"):
            raise TypeError(f"{where}: an image must be a PIL image, got {type(img).__name__}")
    return list(images)


def _part_image(part: dict, param: str, policy: MediaPolicy):
    if part["type"] == "image_pil":
        value = part.get("image_pil")
    else:
        value = part.get("image_url")
        value = value.get("url") if isinstance(value, dict) else value
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, str):
        return load_image(value, policy, param=param)
    raise TypeError(f"{param}: an image part needs a URL string or a PIL image, got {type(value).__name__}")


def split_chat_images(conversation: list[dict], policy: MediaPolicy | None = None) -> tuple[list[dict], list]:
    """(messages with each image part as {"type": "image"}, the pictures in order)."""
    policy = policy or MediaPolicy()
    out, images = [], []
    for i, msg in enumerate(conversation):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            out.append(msg)
            continue
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                images.append(_part_image(part, f"messages[{i}].content[{j}]", policy))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**msg, "content": parts})
    return out, images
