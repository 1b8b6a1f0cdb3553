"""The pictures an image processor takes: a LoadedImage (media.py: decoded and checked, with its
content hash) or a bare PIL image (the offline LLM), hashed here by the same rule (image_check)."""

from __future__ import annotations

from PIL import Image

from fdcli_engine.multimodal.image_check import content_hash, to_rgb


def pil_content_hash(image: Image.Image) -> str:
    """LoadedImage.content_hash of a bare PIL image (converted to RGB first, as media.py decodes)."""
    return content_hash(to_rgb(image))


def as_loaded(item) -> tuple[Image.Image, str]:
    """(RGB picture, content hash) of a LoadedImage (media.py) or a bare PIL image."""
    if isinstance(item, Image.Image):
        return item, pil_content_hash(item)
    image, digest = getattr(item, "image", None), getattr(item, "content_hash", None)
    if not isinstance(image, Image.Image) or not isinstance(digest, str):
        raise TypeError(f"an image must be a PIL image or a LoadedImage, got {type(item).__name__}")
    return image, digest
