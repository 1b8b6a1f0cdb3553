"""Image parts of chat messages, for every route that renders messages (chat, embeddings, reward, and
`fd run-batch` lines through the same serving objects).

An `image_url` part (OpenAI's `{"type": "image_url", "image_url": {"url": ...}}`, or the bare string
form) is found and counted against --limit-mm-per-prompt, loaded off the event loop within the
server's MediaPolicy (fdcli_engine.multimodal.media), and only then checked against the model: a
text-only model answers "does not accept images" naming the part, after the picture itself was
validated. The chat template sees each image part as `{"type": "image"}` (what HF templates expect);
the model's ImageProcessor then expands each placeholder it wrote and returns the features the engine
needs. Other media part types are a 400 that says what to send instead.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fdcli_engine.entrypoints.openai.errors import bad_request
from fdcli_engine.errors import InvalidRequestError
from fdcli_engine.multimodal.content_parts import IMAGE_URL_PARTS
from fdcli_engine.multimodal.image_limit import DEFAULT_IMAGE_LIMIT
from fdcli_engine.multimodal.media import LoadedImage, MediaPolicy, load_image

# Part types that carry media fd does not read.
OTHER_MEDIA_PARTS = {"image", "video", "video_url", "audio", "audio_url", "input_audio"}
# Fetching and decoding run on their own threads, not the prepare pool: a slow image host (each fetch
# ends at the policy's deadline) then delays only the requests with images, never the templating of
# the others. Few threads: each decode may hold up to MAX_IMAGE_PIXELS of RGB.
_MEDIA_WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fd-media")


@dataclass(frozen=True)
class ImageRef:
    param: str  # "messages[i].content[j]"
    url: str


def part_image_url(part: Any, param: str) -> str:
    """The URL of an image part: `image_url` as {"url": ...} or as the URL string itself."""
    extra = getattr(part, "model_extra", None) or {}
    value = extra.get("image_url") if extra else getattr(part, "image_url", None)
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise bad_request("an image_url part needs image_url.url (a data:, http(s):// or file:// URL)", param)
    return value


def other_media_error(kind: str, param: str):
    return bad_request(
        f"content part type {kind!r} is not supported: send pictures as image_url parts", param
    )


def image_refs(messages, prefix: str = "messages") -> list[ImageRef]:
    """Every image_url part of `messages`, in order; another media part type is a 400."""
    refs = []
    for i, m in enumerate(messages or []):
        content = m.content if isinstance(m.content, list) else []
        for j, part in enumerate(content):
            param = f"{prefix}[{i}].content[{j}]"
            if part.type in IMAGE_URL_PARTS:
                refs.append(ImageRef(param, part_image_url(part, param)))
            elif part.type in OTHER_MEDIA_PARTS:
                raise other_media_error(part.type, param)
    return refs


def _processor_for(engine):
    """The model's ImageProcessor, or None for a text-only model (or an engine without a config)."""
    config = getattr(engine, "config", None)
    hf_config = getattr(config, "hf_config", None)
    if not hf_config:
        return None
    from fdcli_engine.multimodal.processor import get_image_processor

    return get_image_processor(
        hf_config, getattr(config, "model_path", None), getattr(config, "mm_processor_kwargs", None)
    )


class ImageInputs:
    """The image side of one serving layer: where URLs may point, how many images a request may carry,
    and the served model's processor (None: a text-only model)."""

    def __init__(self, engine, policy: MediaPolicy | None = None, limit: int = DEFAULT_IMAGE_LIMIT):
        self.engine = engine
        self.policy = policy or MediaPolicy()
        self.limit = limit
        self._processor: Any = ...  # built at the first image request

    @property
    def processor(self):
        if self._processor is ...:
            self._processor = _processor_for(self.engine)
        return self._processor

    async def load(self, refs: list[ImageRef]) -> list[LoadedImage]:
        """The pictures of `refs`, fetched and decoded concurrently off the event loop; the first bad one
        is the 400 (each fetch is bounded by the policy's timeout and byte cap)."""
        if not refs:
            return []
        if len(refs) > self.limit:
            raise bad_request(
                f"at most {self.limit} image{'' if self.limit == 1 else 's'} per request "
                f"(--limit-mm-per-prompt), got {len(refs)}",
                refs[self.limit].param,
            )
        loop = asyncio.get_running_loop()
        tasks = [
            loop.run_in_executor(
                _MEDIA_WORKERS, functools.partial(load_image, r.url, self.policy, param=r.param)
            )
            for r in refs
        ]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, InvalidRequestError):
                raise bad_request(str(result), result.param) from None
            if isinstance(result, BaseException):
                raise result
        if self.processor is None:
            model = getattr(getattr(self.engine, "model_config", None), "served_model_name", "") or "served"
            raise bad_request(
                f"model {model!r} does not accept images: it is a text-only model", refs[0].param
            )
        return list(results)

    def expand(
        self, prompt_ids: list[int], images: list[LoadedImage], kwargs: dict | None, param: str
    ) -> tuple[list[int], list]:
        """The prompt with each image placeholder expanded, and the features of each image."""
        if kwargs is not None and not isinstance(kwargs, dict):
            raise bad_request("mm_processor_kwargs must be an object", "mm_processor_kwargs")
        try:
            ids, features = self.processor.process(list(prompt_ids), images, kwargs or None)
        except InvalidRequestError as e:
            raise bad_request(str(e), e.param or param) from None
        except ValueError as e:  # a picture the processor cannot shape (e.g. its aspect ratio)
            raise bad_request(f"the image cannot be processed: {e}", param) from None
        return list(ids), list(features)


def check_truncation(
    before: int, after: int, has_images: bool, param: str = "truncate_prompt_tokens"
) -> None:
    """Truncating a prompt with images could cut an image's placeholders apart: refused."""
    if has_images and after != before:
        raise bad_request("truncate_prompt_tokens would cut a prompt with images; send fewer tokens", param)
