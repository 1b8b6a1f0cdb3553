"""Images on requests: the add message carries them over the core socket (msgspec, no pickle), and a
block's prefix hash covers every image overlapping it and nothing else."""

from __future__ import annotations

import numpy as np

from fdcli_engine.api.core_messages import input_decoder, input_encoder
from fdcli_engine.multimodal.inputs import MultiModalFeature
from fdcli_engine.request import EngineCoreRequest, Request
from fdcli_engine.sampling_params import SamplingParams

PAD = 9


def _feature(digest: str, offset: int = 6, length: int = 6) -> MultiModalFeature:
    pixels = np.arange(24, dtype=np.float32).reshape(4, 6) + len(digest)
    return MultiModalFeature.from_pixels("image", digest, offset, length, pixels, [1, 2, 2], extra={"k": [1]})


def test_add_message_round_trips_over_the_socket():
    req = EngineCoreRequest("r", [1, 2, 3], SamplingParams(max_tokens=3), 1.0, None, [_feature("ab")])
    got = input_decoder.decode(input_encoder.encode(req))
    assert isinstance(got, EngineCoreRequest) and got == req
    np.testing.assert_array_equal(got.mm_features[0].pixels(), req.mm_features[0].pixels())
    assert got.mm_features[0].extra == {"k": [1]} and got.mm_features[0].grid_thw == [1, 2, 2]


def _hashes(digest: str | None, salt: str | None = None) -> list[bytes]:
    prompt = [1, 2, 3, 4, 5, 6] + [PAD] * 6 + [7, 8, 9, 10, 11, 12]
    feats = [_feature(digest)] if digest else None
    params = SamplingParams(cache_salt=salt) if salt else None
    return Request("r", prompt, params, 1024, mm_features=feats).update_block_hashes(4)


def test_block_hashes_cover_overlapping_images_only():
    a, a2, b, text = _hashes("aa"), _hashes("aa"), _hashes("bb"), _hashes(None)
    assert a == a2
    # blocks: [0:4] text, [4:8] holds the image's start, [8:12] inside it, [12:16] after it
    assert a[0] == b[0] == text[0]
    assert a[1] != b[1] and a[1] != text[1]
    assert a[2] != b[2] and a[3] != b[3]  # the chain carries the difference on
    assert _hashes("aa", salt="s")[0] != a[0]

    # A salt spelled like the image's hash part cannot stand in for the image itself.
    prompt = [PAD] * 4 + [1, 2, 3, 4]
    with_image = Request("r", prompt, None, 1024, mm_features=[_feature("aa", 0, 4)])
    salted = Request("r", prompt, SamplingParams(cache_salt="iimage:aa:0"), 1024)
    assert with_image.update_block_hashes(4)[0] != salted.update_block_hashes(4)[0]
