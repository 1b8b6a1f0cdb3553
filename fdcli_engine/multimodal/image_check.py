"""Bytes → a checked RGB picture: the format told by magic bytes (PNG, JPEG, WebP only), the pixel count
read from the header and capped before any pixel is decoded, then a full decode with Pillow (its
decompression-bomb guard left on). Every failure is an InvalidRequestError whose message names what is
wrong with the picture and nothing about where it came from.
"""

from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass

from PIL import Image

from fdcli_engine.errors import InvalidRequestError

# Formats by their leading bytes; the declared mime type (data: URL, Content-Type) is never trusted.
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
)
_OTHER_FORMATS = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
)
SUPPORTED = "PNG, JPEG or WebP"


@dataclass(frozen=True)
class LoadedImage:
    """A decoded picture (RGB) and the hash of its content: sha256 over mode, size and pixel bytes, so
    the same picture re-encoded losslessly hashes equal."""

    image: Image.Image
    content_hash: str


def sniff_format(data: bytes) -> str | None:
    """PNG, JPEG or WEBP from the leading bytes; None for anything else."""
    for magic, name in _MAGIC:
        if data.startswith(magic):
            return name
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def header_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """(width, height) as the file's header states them, read without Pillow; None if not found."""
    try:
        if fmt == "PNG" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if fmt == "JPEG":
            return _jpeg_size(data)
        if fmt == "WEBP":
            return _webp_size(data)
    except (struct.error, IndexError):
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame size from the first start-of-frame marker (SOF0..SOF15 but DHT, JPG, DAC)."""
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD9)):  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    return None


def _unsupported(data: bytes, param: str) -> InvalidRequestError:
    named = next((name for magic, name in _OTHER_FORMATS if data.startswith(magic)), None)
    what = f"{named} images are" if named else "this content is"
    return InvalidRequestError(f"{what} not supported: send a {SUPPORTED} image", param=param)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (transformers' convert_to_rgb, which every
    image processor fd mirrors applies), so a picture's pixels and its hash see the same colours."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def content_hash(image: Image.Image) -> str:
    h = hashlib.sha256()
    h.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def decode_image(data: bytes, *, max_pixels: int, param: str) -> LoadedImage:
    """The picture in `data`, converted to RGB (`to_rgb`); a 400 for an unsupported format, a header over
    `max_pixels`, or bytes that do not decode (corrupt, truncated)."""
    if not data:
        raise InvalidRequestError("the image is empty", param=param)
    fmt = sniff_format(data)
    if fmt is None:
        raise _unsupported(data, param)
    broken = InvalidRequestError(
        f"the {fmt} image could not be decoded: it is corrupt or truncated", param=param
    )
    # fd's own cap, from the header bytes, before Pillow sees the file; Pillow's checks follow.
    stated = header_size(data, fmt)
    if stated is not None and stated[0] * stated[1] > max_pixels:
        raise _too_large(stated, max_pixels, param)
    try:
        # Image.open reads the header only; `formats` keeps Pillow to the format the bytes claim.
        with Image.open(io.BytesIO(data), formats=[fmt]) as header:
            width, height = header.size
    except Image.DecompressionBombError:
        raise _too_large(None, max_pixels, param) from None
    except Exception:  # noqa: BLE001 - any header Pillow refuses is a bad image
        raise broken from None
    if width <= 0 or height <= 0:
        raise broken
    if width * height > max_pixels:
        raise _too_large((width, height), max_pixels, param)
    try:
        with Image.open(io.BytesIO(data), formats=[fmt]) as probe:
            probe.verify()  # checksums and structure, without keeping pixels
        with Image.open(io.BytesIO(data), formats=[fmt]) as im:
            im.seek(0)  # an animated WebP: its first frame
            rgb = to_rgb(im)
            rgb.load()  # decodes every pixel (a truncated stream raises here) before the file closes
    except Image.DecompressionBombError:
        raise _too_large((width, height), max_pixels, param) from None
    except Exception:  # noqa: BLE001 - OSError, SyntaxError, ValueError... all mean a broken file
        raise broken from None
    return LoadedImage(rgb, content_hash(rgb))


def _too_large(size: tuple[int, int] | None, max_pixels: int, param: str) -> InvalidRequestError:
    dims = f" ({size[0]}x{size[1]})" if size else ""
    return InvalidRequestError(
        f"the image is too large{dims}: at most {max_pixels} pixels are accepted", param=param
    )
