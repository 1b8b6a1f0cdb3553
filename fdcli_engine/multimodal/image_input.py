"""The pictures an image processor takes: a LoadedImage (media.py: decoded and checked, with its
content hash) or a bare PIL image (the offline LLM), whose hash is computed here by the same rule."""

from __future__ import annotations

import hashlib

from PIL import Image


def pil_content_hash(image: Image.Image) -> str:
    """sha256 over mode, size and the RGB pixel bytes (the same picture re-encoded losslessly hashes
    equal); the rule LoadedImage.content_hash follows."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    h = hashlib.sha256()
    h.update(f"{rgb.mode}:{rgb.width}x{rgb.height}:".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()


def as_loaded(item) -> tuple[Image.Image, str]:
    """(RGB picture, content hash) of a LoadedImage (media.py) or a bare PIL image."""
    if isinstance(item, Image.Image):
        return item, pil_content_hash(item)
    image, content_hash = getattr(item, "image", None), getattr(item, "content_hash", None)
    if not isinstance(image, Image.Image) or not isinstance(content_hash, str):
        raise TypeError(f"an image must be a PIL image or a LoadedImage, got {type(item).__name__}")
    return image, content_hash
