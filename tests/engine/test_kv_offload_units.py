"""The KV offload tiers' parts on their own: options, the int8 codec against the C8 cache's quantizer and
its error after a restore (logits within the C8 cache's stated tolerance), the memory tier's byte bound,
the file tier's bound, atomic files and damaged-file handling, and the persisted prefix-hash key."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import tiny_models
from test_kv_cache_dtypes import TOLERANCES

from fdcli_engine.config import EngineConfig
from fdcli_engine.errors import ConfigError
from fdcli_engine.kv_transfer.base import KVBlockViews
from fdcli_engine.kv_transfer.offload import codec as codec_module
from fdcli_engine.kv_transfer.offload.codec import BlockCodec, quantize_rows
from fdcli_engine.kv_transfer.offload.file_tier import HEADER, FileTier
from fdcli_engine.kv_transfer.offload.identity import KEY_FILE, load_or_create_key
from fdcli_engine.kv_transfer.offload.memory_tier import MemoryTier


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(swap_space=-1), "--swap-space must be at least 0"),
        (dict(kv_offload_compression="int8"), "compresses an offload tier"),
        (dict(swap_space=1, kv_offload_compression="fp8"), "use none or int8"),
        (dict(kv_offload_dir_gb=1), "give --kv-offload-dir too"),
        (dict(kv_offload_dir="/tmp/x", kv_offload_dir_gb=0), "must be positive"),
        (dict(kv_offload_dir="/tmp/x", kv_offload_dir_gb=-2), "must be positive"),
        (dict(kv_offload_dir="/tmp/x", tensor_parallel_size=2), "not supported with --tensor-parallel-size"),
        (
            dict(swap_space=1, kv_offload_compression="int8", tensor_parallel_size=2),
            "not supported with --tensor-parallel-size",
        ),
        (dict(swap_space=1, runner="pooling"), "needs a generative model"),
        (dict(kv_offload_dir="/tmp/x", data_parallel_size=2), "serves one engine"),
    ],
)
def test_options_refused_with_a_clear_message(options, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**options).validate()


def test_options_normalized():
    c = EngineConfig(swap_space=2, kv_offload_compression="INT8").validate()
    assert (c.swap_space, c.kv_offload_compression, c.kv_offload_dir) == (2, "int8", None)
    c = EngineConfig(kv_offload_dir="/tmp/x", kv_offload_compression="none").validate()
    assert (c.swap_space, c.kv_offload_compression, c.kv_offload_dir_gb) == (0, None, 8.0)
    assert EngineConfig().validate().swap_space == 0


def test_swap_space_with_tensor_parallel_runs_without_the_tier():
    # FastDeploy's launch lines pair -tp N with --swap-space: one note, no tier.
    from fdcli_engine.kv_offload_options import kv_offload_enabled, kv_offload_notes

    c = EngineConfig(swap_space=50, tensor_parallel_size=2).validate()
    assert not kv_offload_enabled(c)
    (note,) = kv_offload_notes(c)
    assert note.startswith("--swap-space 50 has no effect with --tensor-parallel-size 2")
    assert kv_offload_enabled(EngineConfig(swap_space=50).validate())
    assert kv_offload_notes(EngineConfig(swap_space=50).validate()) == []


def test_numpy_quantizer_is_the_c8_caches():
    import paddle
    from fd_kernels.reference import quantize_kv_s8

    x = np.random.default_rng(0).standard_normal((3, 5, 8, 32)).astype(np.float32)
    x[0, 0, 0] = 0  # an all-zero row: scale 1, codes 0
    q, s = quantize_rows(x)
    q_ref, s_ref = quantize_kv_s8(paddle.to_tensor(x))
    np.testing.assert_array_equal(q, q_ref.numpy())
    np.testing.assert_array_equal(s, s_ref.numpy())


def _views(dtype, n=4, seed=0):
    rng = np.random.default_rng(seed)
    shape = (n, 2, 4, 8)
    if dtype == "bfloat16":
        arrays = [(rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)]
    else:
        arrays = [rng.standard_normal(shape).astype(np.float32)]
    return KVBlockViews(arrays * 2, block_size=4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_codec_raw_is_bit_exact_and_int8_is_smaller(dtype):
    views = _views(dtype)
    raw, c8 = BlockCodec(views, None), BlockCodec(views, "int8")
    parts = views.read(1)
    back = raw.from_bytes(raw.to_bytes(raw.encode(parts)))
    assert all(np.array_equal(a, b) for a, b in zip(parts, raw.decode(back)))
    assert c8.nbytes < raw.nbytes
    lossy = c8.decode(c8.from_bytes(c8.to_bytes(c8.encode(parts))))
    assert [p.dtype for p in lossy] == [p.dtype for p in parts]
    assert c8.from_bytes(b"\0" * (c8.nbytes - 1)) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_codec_native_and_numpy_rules_agree_with_the_c8_quantizer(dtype):
    from fd_kernels import native
    from fd_kernels.native import kv_s8

    native.load()
    views = _views(dtype, n=3)
    rules = {"native": (kv_s8.kv_s8_quantize, kv_s8.kv_s8_dequantize), "numpy": None}
    stored, restored = {}, {}
    for name, rule in rules.items():
        codec = BlockCodec(views, "int8", row_rule=rule) if rule else BlockCodec(views, "int8")
        if rule is None:
            codec._quantize, codec._dequantize = codec_module._numpy_quantize, codec_module._numpy_dequantize
        stored[name] = codec.from_bytes(codec.to_bytes(codec.encode_block(views, 2)))
        pool = KVBlockViews([a.copy() for a in views.arrays], views.block_size)
        codec.decode_into(stored[name], pool, 0)
        restored[name] = pool.read(0)
        assert all(np.array_equal(a, b) for a, b in zip(pool.read(1), views.read(1)))  # only block 0
    assert all(np.array_equal(a, b) for a, b in zip(stored["native"], stored["numpy"]))
    assert all(np.array_equal(a, b) for a, b in zip(restored["native"], restored["numpy"]))
    x = np.stack(views.read(2))
    if dtype == "bfloat16":
        x = (x.astype(np.uint32) << 16).view(np.float32)
    q, s = quantize_rows(x)
    assert np.array_equal(stored["native"][0], q) and np.array_equal(stored["native"][1], s)


def restored_logits(folder, kv_cache_dtype, compression):
    """Logits of 20 tokens decoded after a 40-token prefix whose blocks went through the codec."""
    from fdcli_engine.runner.kv_cache import allocate_kv_caches, kv_block_views

    model = tiny_models.load_fd_model(folder)
    runner = tiny_models.PagedRunner(model, num_blocks=64, block_size=4)
    runner.kv_caches = allocate_kv_caches(model, 64, 4, kv_cache_dtype)
    toks = [int(t) for t in np.random.default_rng(0).integers(3, 500, 60)]
    runner.step([("a", toks[:40])])
    if compression != "off":
        views = kv_block_views([runner.kv_caches], 4)
        codec = BlockCodec(views, compression)
        for bid in runner.seqs["a"]["blocks"]:  # the engine's path: read from and written into the pool
            codec.decode_into(codec.encode_block(views, bid), views, bid)
    return np.concatenate([runner.step([("a", [t])]) for t in toks[40:]])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_restore_within_the_c8_caches_error(tiny_model_dir, dtype):
    folder = tiny_model_dir("LlamaForCausalLM")
    want = restored_logits(folder, dtype, "off")
    assert np.array_equal(restored_logits(folder, dtype, None), want)  # raw: bit-exact
    err = np.abs(restored_logits(folder, dtype, "int8") - want)
    max_err, mean_err, _ = TOLERANCES["int8"]
    assert 0 < err.max() < max_err and err.mean() < mean_err, (err.max(), err.mean())


def test_memory_tier_bound_is_exact_and_lru():
    block = [np.zeros(100, np.uint8)]
    tier = MemoryTier(350)
    for i in range(10):
        tier.put(bytes([i]), block)
        assert tier.nbytes <= 350
    assert len(tier) == 3 and tier.nbytes == 300
    tier.get(bytes([7]))  # used: the next eviction takes 8
    evicted = tier.put(b"new", block)
    assert [h for h, _ in evicted] == [bytes([8])] and bytes([7]) in tier
    assert tier.put(b"huge", [np.zeros(351, np.uint8)]) == [] and b"huge" not in tier


def _dir_bytes(d):
    return sum(e.stat().st_size for e in os.scandir(d))


def test_file_tier_bound_atomic_files_and_damage(tmp_path):
    views = _views("float32", n=8)
    codec = BlockCodec(views, None)
    size = HEADER.size + codec.nbytes
    ident = b"i" * 32
    tier = FileTier(tmp_path, 3 * size + 10, ident, codec)
    for i in range(8):
        tier.put(bytes([i]) * 32, codec.encode(views.read(i)))
        tier.flush()
        assert _dir_bytes(tier.dir) <= tier.capacity and tier.nbytes == _dir_bytes(tier.dir)
    assert len(tier) == 3
    assert not [n for n in os.listdir(tier.dir) if n.startswith(".tmp")]
    got = tier.get(bytes([7]) * 32)
    assert all(np.array_equal(a, b) for a, b in zip(codec.decode(got), views.read(7)))
    tier.close()

    # A restart finds the files; a damaged one is a miss and is deleted; another identity sees nothing.
    path = tier.dir / ((bytes([6]) * 32).hex() + ".kv")
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    again = FileTier(tmp_path, 3 * size + 10, ident, codec)
    assert len(again) == 3
    assert again.get(bytes([6]) * 32) is None and not path.exists() and again.num_corrupt == 1
    assert again.get(bytes([7]) * 32) is not None
    again.close()
    other = FileTier(tmp_path, 3 * size + 10, b"j" * 32, codec)
    assert len(other) == 0 and other.get(bytes([7]) * 32) is None
    other.close()


def test_prefix_hash_key_is_private_and_stable(tmp_path):
    key = load_or_create_key(tmp_path)
    assert len(key) == 32 and load_or_create_key(tmp_path) == key
    assert stat.S_IMODE(os.stat(tmp_path / KEY_FILE).st_mode) == 0o600
