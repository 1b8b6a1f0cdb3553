"""Prefix-cache isolation (#28 item 7): vLLM's `cache_salt` keeps requests of different tenants from
sharing cached blocks (read from the cached-token counts the server reports), and block hashes are
keyed with a per-process secret, so a client cannot compute the hash of any block."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from array import array

import pytest

from fdcli_engine.prefix_hash import hash_block_tokens
from fdcli_engine.request import Request
from fdcli_engine.sampling_params import SamplingParams

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)  # several full blocks


def _hashes(salt: str | None, tokens=tuple(range(1, 49))) -> list[bytes]:
    req = Request("r", list(tokens), SamplingParams(cache_salt=salt), max_model_len=256)
    return req.update_block_hashes(16)


def test_salt_separates_the_whole_chain():
    plain, a, a_again, b = _hashes(None), _hashes("tenant-a"), _hashes("tenant-a"), _hashes("tenant-b")
    assert a == a_again
    for other in (plain, b):
        assert all(x != y for x, y in zip(a, other))  # the first block differs, so every block does
    # Salts are length-prefixed: ("ab" + tokens) never equals ("a" + "b..." tokens) by concatenation.
    assert hash_block_tokens(None, [1], b"ab") != hash_block_tokens(None, [1], b"a")


def test_block_hashes_are_keyed_per_process():
    code = "from fdcli_engine.prefix_hash import hash_block_tokens as h; print(h(None, [1, 2, 3]).hex())"
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(runs) == 2  # two processes, two secrets
    here = hash_block_tokens(None, [1, 2, 3])
    content = b"fd-prefix-v2" + array("q", [1, 2, 3]).tobytes()
    unkeyed = {hashlib.sha256(content).digest(), hashlib.blake2b(content, digest_size=32).digest()}
    assert here not in unkeyed and here.hex() + "\n" not in runs


def test_bad_salts_are_refused():
    for salt in ("", "s" * 1025):
        with pytest.raises(Exception, match="cache_salt"):
            SamplingParams(cache_salt=salt)


def _cached(client, salt: str | None, chat: bool = False) -> int:
    extra = {"extra_body": {"cache_salt": salt}} if salt is not None else {}
    if chat:
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": LONG}], max_tokens=1, **extra
        )
    else:
        r = client.completions.create(model="tiny", prompt=LONG, max_tokens=1, **extra)
    details = r.usage.prompt_tokens_details
    return details.cached_tokens if details else 0


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_requests_with_different_salts_never_share_blocks(server, chat):
    c = server.client()
    tag = "chat" if chat else "cmpl"
    assert _cached(c, f"{tag}-a", chat) == 0  # first sight of this salt
    assert _cached(c, f"{tag}-a", chat) > 0  # the same tenant again: its own blocks
    assert _cached(c, f"{tag}-b", chat) == 0  # another tenant: nothing shared
    _cached(c, None, chat)  # unsalted (other tests may have sent it already): its own chain
    assert _cached(c, None, chat) > 0
    assert _cached(c, f"{tag}-c", chat) == 0  # an unsalted run's blocks are not a salted one's
