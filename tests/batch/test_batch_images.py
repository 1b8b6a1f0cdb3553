"""`fd run-batch` lines with pictures: the CLI (a subprocess, with the image flags) on a tiny random
Qwen2.5-VL answers each chat line with the tokens transformers generates for the same picture; a bad
picture, a file outside --allowed-local-media-path and too many images fail their own line with a 400
naming the part, and the other lines complete."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_vl
import vl_reference
from batch_helpers import cli_args, read_jsonl, run_cli, write_jsonl
from image_fixtures import corrupt_png, data_url
from vl_reference import MAX_TOKENS, QUESTION, hf_greedy, png_bytes


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_vl.make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


def image_line(custom_id: str, *urls: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_image_lines(folder, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    pictures = [tiny_vl.random_image(56, 84, seed=0), tiny_vl.random_image(84, 56, seed=1)]
    (media / "b.png").write_bytes(png_bytes(pictures[1]))
    (tmp_path / "outside.png").write_bytes(png_bytes(pictures[1]))
    lines = [
        image_line("data", data_url(png_bytes(pictures[0]))),
        image_line("file", f"file://{media}/b.png"),
        image_line("corrupt", data_url(corrupt_png())),
        image_line("outside", f"file://{tmp_path}/outside.png"),
        image_line("two", data_url(png_bytes(pictures[0])), data_url(png_bytes(pictures[1]))),
    ]
    out = tmp_path / "out.jsonl"
    args = cli_args(folder, "-i", str(write_jsonl(tmp_path / "in.jsonl", lines)), "-o", str(out))
    args += [
        "--allowed-local-media-path",
        str(media),
        "--limit-mm-per-prompt",
        '{"image": 1}',
        "--no-progress",
    ]
    proc = run_cli(args)
    assert proc.returncode != 0  # some lines failed (on purpose)
    recs = {r["custom_id"]: r["response"] for r in read_jsonl(out)}
    hf = vl_reference.load(folder)
    for cid, picture in (("data", pictures[0]), ("file", pictures[1])):
        assert recs[cid]["status_code"] == 200, recs[cid]
        assert recs[cid]["body"]["choices"][0]["token_ids"] == hf_greedy(hf, [picture])[0]
    for cid, param, words in (
        ("corrupt", "messages[0].content[0]", "corrupt"),
        ("outside", "messages[0].content[0]", "--allowed-local-media-path"),
        ("two", "messages[0].content[1]", "at most 1 image per request"),
    ):
        err = recs[cid]["body"]["error"]
        assert recs[cid]["status_code"] == 400 and err["param"] == param and words in err["message"], err


def test_embedding_lines_with_a_picture(folder, tmp_path):
    # The same flags and serving layer on a pooling run: an embeddings line in the messages form.
    picture = tiny_vl.random_image(84, 56, seed=3)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(png_bytes(picture))}},
                {"type": "text", "text": "a caption"},
            ],
        }
    ]
    lines = [
        {
            "custom_id": "e",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "tiny", "messages": messages},
        }
    ]
    out = tmp_path / "out.jsonl"
    args = cli_args(folder, "-i", str(write_jsonl(tmp_path / "in.jsonl", lines)), "-o", str(out))
    proc = run_cli([*args, "--runner", "pooling", "--convert", "embed", "--no-progress"])
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    (rec,) = read_jsonl(out)
    got = np.array(rec["response"]["body"]["data"][0]["embedding"], dtype=np.float32)
    hf_messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a caption"}]}]
    want = vl_reference.hf_last_hidden(vl_reference.load(folder), hf_messages, [picture]).numpy()
    np.testing.assert_allclose(got, want / np.linalg.norm(want), atol=1e-4)
