"""The tiny ERNIE checkpoints rewritten by this test into FastDeploy's "-Paddle" layout must give the
same logits as the HF layout (exactly: the conversion only transposes, splits and renames fp32 data).

The mapping written here, HF ("-PT") -> Paddle ("-Paddle"):
    model.*                                      -> ernie.*                      (name prefix)
    Linear weights [out, in]                     -> [in, out]                     (transposed)
    self_attn.{q,k,v}_proj.weight                -> self_attn.qkv_proj.weight     [hidden, q+k+v], q|k|v
    {mlp,experts.e,shared_experts}.{gate,up}_proj -> ....up_gate_proj.weight      [hidden, 2I], gate|up
    mlp.gate.weight [E, hidden] (router)         -> mlp.gate.weight [hidden, E]
    lm_head.weight [vocab, hidden]               -> lm_head.weight [hidden, vocab] (no prefix)
    embed_tokens, norms, moe_statics bias        -> unchanged
The tensors are split over two shard files listed in model.safetensors.index.json, as published.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from ernie_archs import DENSE, MOE
from safetensors.numpy import save_file
from test_ernie_models import PROMPT, build_fd
from tiny_models import PagedRunner

from fdcli_engine.errors import ModelLoadError
from fdcli_engine.loader import read_model_config
from fdcli_engine.loader.hf import iter_hf_weights
from fdcli_engine.loader.paddle_layout import is_paddle_folder, iter_paddle_weights


def to_paddle_layout(hf_folder, out_folder):
    """Rewrite an HF ERNIE folder into the -Paddle layout (mapping in the module docstring)."""
    hf = dict(iter_hf_weights(hf_folder))
    out: dict[str, np.ndarray] = {}
    for name, w in hf.items():
        pname = "ernie." + name[len("model.") :] if name.startswith("model.") else name
        if name.endswith("self_attn.q_proj.weight"):
            base = pname[: -len("q_proj.weight")]
            qkv = [hf[name], hf[name.replace("q_proj", "k_proj")], hf[name.replace("q_proj", "v_proj")]]
            out[base + "qkv_proj.weight"] = np.concatenate(qkv).T
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight", "up_proj.weight")):
            continue  # written with their q_proj / gate_proj
        elif name.endswith("gate_proj.weight"):
            base = pname[: -len("gate_proj.weight")]
            out[base + "up_gate_proj.weight"] = np.concatenate(
                [w, hf[name.replace("gate_proj", "up_proj")]]
            ).T
        elif w.ndim == 2 and name != "model.embed_tokens.weight":
            out[pname] = w.T  # o_proj, down_proj, router, lm_head
        else:
            out[pname] = w
    out_folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(hf_folder / "config.json", out_folder / "config.json")
    names = sorted(out)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: np.ascontiguousarray(out[k], dtype=np.float32) for k in keys}, str(out_folder / file))
        weight_map.update(dict.fromkeys(keys, file))
    (out_folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return out_folder


@pytest.fixture(scope="module", params=[DENSE, MOE], ids=["dense", "moe"])
def both_layouts(request, ernie_checkpoint, tmp_path_factory):
    hf_folder = ernie_checkpoint(request.param)
    paddle_folder = to_paddle_layout(hf_folder, tmp_path_factory.mktemp("paddle") / "ckpt")
    return request.param, hf_folder, paddle_folder


def test_paddle_layout_gives_identical_outputs(both_layouts):
    arch, hf_folder, paddle_folder = both_layouts
    assert is_paddle_folder(paddle_folder) and not is_paddle_folder(hf_folder)
    from_hf = build_fd(hf_folder, arch)
    from_paddle = build_fd(
        paddle_folder, arch, weights=iter_paddle_weights(paddle_folder, read_model_config(paddle_folder))
    )
    a, b = PagedRunner(from_hf), PagedRunner(from_paddle)
    np.testing.assert_array_equal(a.step([("s", PROMPT)]), b.step([("s", PROMPT)]))
    for token in [8, 300, 21]:
        np.testing.assert_array_equal(a.step([("s", [token])]), b.step([("s", [token])]))
    assert PagedRunner(from_hf).greedy("g", PROMPT, 16) == PagedRunner(from_paddle).greedy("g", PROMPT, 16)


def test_paddle_fused_projection_of_wrong_width_is_a_clear_error(ernie_checkpoint, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    shutil.copy(ernie_checkpoint(DENSE) / "config.json", folder / "config.json")
    save_file(
        {"ernie.layers.0.self_attn.qkv_proj.weight": np.zeros((64, 100), np.float32)},
        str(folder / "m.safetensors"),
    )
    assert is_paddle_folder(folder)  # detected from the file header when there is no index
    with pytest.raises(ModelLoadError, match="qkv_proj.*do not split"):
        list(iter_paddle_weights(folder, read_model_config(folder)))


def test_paddle_index_naming_a_missing_shard_is_a_clear_error(both_layouts, tmp_path):
    _, _, paddle_folder = both_layouts
    broken = tmp_path / "broken"
    shutil.copytree(paddle_folder, broken)
    (broken / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="do not exist: model-00002-of-00002"):
        list(iter_paddle_weights(broken, read_model_config(broken)))
