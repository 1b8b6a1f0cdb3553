"""Qwen2.5-VL in fd against transformers on a tiny random checkpoint (tests/tiny_vl.py), the model on
its own: transformers' image processor output is the input of both, so the processor (tests/
multimodal) and the model are tested apart. fp32 throughout; logits agree within 1e-4."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
import tiny_vl
from tiny_models import load_fd_model, make_attention_metadata

from fdcli_engine.multimodal.inputs import MultiModalFeature

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
BLOCK = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_vl.make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf(folder):
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def fd(folder):
    from fdcli_engine import ops

    previous = ops.backend
    ops.use("reference")  # the module's model is built before the per-test reference_ops fixture
    try:
        return load_fd_model(folder)
    finally:
        ops.use(previous)


def _prompt(hf, folder, sizes):
    """(token ids with each image's placeholders expanded, features) from transformers' image processor."""
    ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    pad = hf.config.image_token_id
    ids, feats = [1, 5], []
    for i, size in enumerate(sizes):
        out = ip(images=[tiny_vl.random_image(*size, seed=i)], return_tensors="np")
        grid = out["image_grid_thw"][0].tolist()
        n = int(np.prod(grid)) // 4
        ids.append(hf.config.vision_start_token_id)
        feats.append(MultiModalFeature.from_pixels("image", f"h{i}", len(ids), n, out["pixel_values"], grid))
        ids += [pad] * n + [hf.config.vision_end_token_id, 7 + i]
    return ids + [8, 9, 10], feats


def _hf_logits(hf, ids, feats):
    t = torch.tensor([ids])
    with torch.no_grad():
        out = hf(
            input_ids=t,
            attention_mask=torch.ones_like(t),
            pixel_values=torch.tensor(np.concatenate([f.pixels() for f in feats])),
            image_grid_thw=torch.tensor([f.grid_thw for f in feats]),
            mm_token_type_ids=(t == hf.config.image_token_id).int(),
        )
    return out.logits[0].numpy()


def _kv(fd):
    shape = [64, fd.num_kv_heads, BLOCK, fd.head_dim]
    return [(paddle.zeros(shape), paddle.zeros(shape)) for _ in range(fd.num_layers)]


def _run_chunks(fd, ids, feats, cuts):
    """fd's logits of the prompt computed in chunks ending at `cuts` (a chunk may split an image)."""
    rows = paddle.concat(fd.embed_images(feats))
    image_pos = np.concatenate([np.arange(f.offset, f.end) for f in feats])
    pos3, _ = fd.mm_positions(ids, feats)
    blocks = list(np.random.default_rng(0).permutation(64)[: len(ids) // BLOCK + 1])
    kv, out, start = _kv(fd), [], 0
    for end in cuts:
        meta, _ = make_attention_metadata([(start, end - start, blocks)], BLOCK)
        inside = (image_pos >= start) & (image_pos < end)
        mm = None
        if inside.any():
            mm = (
                paddle.to_tensor(image_pos[inside] - start),
                paddle.gather(rows, paddle.to_tensor(np.nonzero(inside)[0])),
            )
        hidden = fd.forward(
            paddle.to_tensor(np.array(ids[start:end])), paddle.to_tensor(pos3[:, start:end]), kv, meta, mm
        )
        out.append(fd.compute_logits(hidden).numpy())
        start = end
    return np.concatenate(out)


@pytest.mark.parametrize("sizes", [[(168, 112)], [(84, 56), (56, 140)]])
def test_prefill_logits_match_transformers(hf, fd, folder, sizes):
    ids, feats = _prompt(hf, folder, sizes)
    want = _hf_logits(hf, ids, feats)
    np.testing.assert_allclose(_run_chunks(fd, ids, feats, [len(ids)]), want, atol=ATOL, rtol=0)


def test_chunked_prefill_splits_an_image(hf, fd, folder):
    ids, feats = _prompt(hf, folder, [(168, 112)])
    want = _hf_logits(hf, ids, feats)
    mid = feats[0].offset + feats[0].length // 2  # the cut falls inside the image
    got = _run_chunks(fd, ids, feats, [feats[0].offset + 1, mid, len(ids)])
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_positions_follow_transformers_rope_index(hf, fd, folder):
    ids, feats = _prompt(hf, folder, [(84, 56), (56, 140)])
    t = torch.tensor([ids])
    want, delta = hf.model.get_rope_index(
        t,
        image_grid_thw=torch.tensor([f.grid_thw for f in feats]),
        attention_mask=torch.ones_like(t),
        mm_token_type_ids=(t == hf.config.image_token_id).int(),
    )
    got, got_delta = fd.mm_positions(ids, feats)
    np.testing.assert_array_equal(got, want[:, 0].numpy())
    assert got_delta == int(delta[0, 0])


def test_vision_tower_matches_transformers(hf, fd, folder):
    _, feats = _prompt(hf, folder, [(168, 112), (84, 56)])
    with torch.no_grad():
        want = hf.model.get_image_features(
            torch.tensor(np.concatenate([f.pixels() for f in feats])),
            torch.tensor([f.grid_thw for f in feats]),
        ).pooler_output
    for got, ref in zip(fd.embed_images(feats), want):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=ATOL, rtol=0)


def test_released_config_layout_loads_the_same_model(hf, fd, folder, tmp_path):
    """Qwen's released config.json: text keys at the top, rope_scaling {"type": "mrope"}, the vision
    keys spatial_patch_size / in_chans; and transformers 5's checkpoint names (model.language_model.*,
    model.visual.*). The same weights give the same logits."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    cfg = json.loads((folder / "config.json").read_text())
    text = cfg.pop("text_config")
    section = text.pop("rope_parameters")["mrope_section"]
    old = {**cfg, **text, "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": section}}
    vc = old["vision_config"]
    vc["spatial_patch_size"], vc["in_chans"] = vc.pop("patch_size"), vc.pop("in_channels")
    shutil.copytree(folder, tmp_path / "old")
    (tmp_path / "old" / "config.json").write_text(json.dumps(old))
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {
        (
            "model.language_model." + k[6:]
            if k.startswith("model.")
            else "model." + k
            if k.startswith("visual.")
            else k
        ): v
        for k, v in tensors.items()
    }
    save_file(renamed, str(tmp_path / "old" / "model.safetensors"))
    from fdcli_engine import ops

    previous = ops.backend
    ops.use("reference")
    try:
        other = load_fd_model(tmp_path / "old")
    finally:
        ops.use(previous)
    ids, feats = _prompt(hf, folder, [(84, 56)])
    np.testing.assert_array_equal(
        _run_chunks(other, ids, feats, [len(ids)]), _run_chunks(fd, ids, feats, [len(ids)])
    )
