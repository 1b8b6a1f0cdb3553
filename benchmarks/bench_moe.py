"""Decode speed of a synthetic ERNIE-4.5 MoE shaped like ERNIE-4.5-21B-A3B, scaled down to this CPU.

Shape (defaults): hidden 512, 8 heads / 2 KV heads (head_dim 64), 6 layers of which 5 are MoE (layer 0
dense, as moe_layer_start_index 1), 64 routed experts top-6 with moe_intermediate_size 384, 2 shared
experts, vocab 8192, random weights. The model is built through fd's Ernie4_5_MoeForCausalLM and its
weights go through `load_weights` by HF name, like a checkpoint.

Reports, per batch size: decode tokens/s (batch / median step time, context length ~64) measured two
ways, wall clock and process CPU time, and how each MoE layer's CPU time splits into
- experts: the routed experts' gate_up/down matmuls and activation (`ops.linear`, `silu_and_mul`),
- shared: the shared experts,
- routing: router matmul, softmax/top-k/normalisation (numpy),
- gather/scatter: sorting rows by expert, gathering them, weighting and index_add back (the rest).

On a shared machine run it with OMP_NUM_THREADS=1: the CPU-time figures then count only the work
this process did (time spent descheduled by other load is excluded), so they stay comparable while
the wall-clock ones swing with the load.

    OMP_NUM_THREADS=1 python benchmarks/bench_moe.py [--quantization wint8|wint4|none] [--kernels auto|reference]
                                   [--batches 1,16] [--steps 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

CONFIG = dict(
    architectures=["Ernie4_5_MoeForCausalLM"],
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=8192,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=True,
    moe_num_experts=64,
    moe_k=6,
    moe_intermediate_size=384,
    moe_num_shared_experts=2,
    moe_layer_start_index=1,
    moe_layer_end_index=-1,
    moe_layer_interval=1,
)
BLOCK_SIZE, CONTEXT = 16, 64


def random_weights(model, rng):
    """(HF name, fp32 array) for every tensor the model expects, shaped as its targets require."""
    import numpy as np

    for name, (module, shard, _) in model._targets.items():
        if shard is not None:
            shape = (module.shard_sizes[shard], module.in_features)
        elif hasattr(module, "shape"):  # router
            shape = module.shape
        elif hasattr(module, "num_experts"):  # correction bias
            shape = (1, module.num_experts)
        elif hasattr(module, "vocab_size"):
            shape = (module.vocab_size, module.hidden_size)
        else:
            shape = (module.hidden_size,)
        scale = 1.0 if len(shape) == 1 or "statics" in name else shape[-1] ** -0.5
        w = rng.standard_normal(shape).astype(np.float32) * scale
        yield name, (np.abs(w) * 0.01 if "statics" in name else w)


CLOCK = time.process_time  # CPU seconds of this process: Paddle CPU ops run synchronously in it


class PhaseTimer:
    """CPU seconds per phase."""

    def __init__(self):
        self.seconds = {"moe_total": 0.0, "experts": 0.0, "shared": 0.0, "routing": 0.0}

    def wrap(self, obj, attr, phase):
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            t0 = CLOCK()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += CLOCK() - t0

        setattr(obj, attr, timed)

    def instrument(self, model):
        for i in model.moe_layer_ids:
            moe = model.layers[i].mlp
            self.wrap(moe, "route", "routing")
            moe.experts = [self._timed_expert(e) for e in moe.experts]
            if moe.shared_experts is not None:
                moe.shared_experts = self._timed_call(moe.shared_experts, "shared")
            model.layers[i].mlp = self._timed_call(moe, "moe_total")

    def _timed_expert(self, expert):
        return self._timed_call(expert, "experts")

    def _timed_call(self, obj, phase):
        timer = self

        class Timed:
            def __getattr__(self, name):
                return getattr(obj, name)

            def __call__(self, *args):
                t0 = CLOCK()
                try:
                    return obj(*args)
                finally:
                    timer.seconds[phase] += CLOCK() - t0

        return Timed()


def decode_meta(batch, context, step):
    """AttentionMetadata + positions for one decode token per sequence at length context + step."""
    import numpy as np
    import paddle

    from fdcli_engine.step_types import AttentionMetadata

    blocks_per_seq = (context + 256) // BLOCK_SIZE + 1
    pos = context + step
    slots = [b * blocks_per_seq * BLOCK_SIZE + pos for b in range(batch)]
    table = np.arange(batch * blocks_per_seq, dtype=np.int32).reshape(batch, blocks_per_seq)
    starts = np.arange(batch + 1, dtype=np.int32)
    lens = np.full(batch, pos + 1, dtype=np.int32)
    meta = AttentionMetadata(
        slot_mapping=paddle.to_tensor(np.asarray(slots, dtype=np.int64)),
        query_start_loc=paddle.to_tensor(starts),
        seq_lens=paddle.to_tensor(lens),
        block_tables=paddle.to_tensor(table),
        max_query_len=1,
        max_seq_len=pos + 1,
        block_size=BLOCK_SIZE,
        query_start_loc_np=starts,
        seq_lens_np=lens,
    )
    return meta, paddle.to_tensor(np.full(batch, pos, dtype=np.int64)), blocks_per_seq


def run_batch(model, batch, steps, rng):
    """(median wall seconds per step, median CPU seconds per step, CPU seconds of the timed steps,
    phase CPU seconds summed over the timed steps)."""
    import numpy as np
    import paddle

    _, _, blocks_per_seq = decode_meta(batch, CONTEXT, 0)
    shape = [batch * blocks_per_seq, model.num_kv_heads, BLOCK_SIZE, model.head_dim]
    # Random cache contents stand in for a prefilled context: decode cost does not depend on values.
    kv = [
        (paddle.to_tensor(rng.standard_normal(shape).astype(np.float32)),) * 2
        for _ in range(model.num_layers)
    ]
    timer = PhaseTimer()
    timer.instrument(model)
    walls, cpus = [], []
    for step in range(steps + 2):
        meta, positions, _ = decode_meta(batch, CONTEXT, step)
        ids = paddle.to_tensor(rng.integers(3, model.vocab_size, batch).astype(np.int64))
        if step == 2:  # two warm-up steps, then reset the phase counters
            timer.seconds = dict.fromkeys(timer.seconds, 0.0)
        t0, c0 = time.perf_counter(), CLOCK()
        model.compute_logits(model.forward(ids, positions, kv, meta)).numpy()
        if step >= 2:
            walls.append(time.perf_counter() - t0)
            cpus.append(CLOCK() - c0)
    return statistics.median(walls), statistics.median(cpus), sum(cpus), timer.seconds


def build_model(quantization):
    import numpy as np

    from fdcli_engine.config import EngineConfig
    from fdcli_engine.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM

    model = Ernie4_5_MoeForCausalLM(dict(CONFIG), EngineConfig(quantization=quantization, max_model_len=4096))
    model.load_weights(random_weights(model, np.random.default_rng(0)))
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quantization", default="none", choices=["none", "wint8", "wint4"])
    ap.add_argument("--kernels", default="auto", choices=["auto", "native", "reference"])
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import numpy as np

    from fdcli_engine import ops

    backend = ops.use(args.kernels)
    quant = None if args.quantization == "none" else args.quantization
    results = {"kernels": backend, "quantization": args.quantization, "config": CONFIG, "batches": {}}
    print(f"kernels={backend} quantization={args.quantization} threads={os.environ['OMP_NUM_THREADS']}")
    for batch in (int(b) for b in args.batches.split(",")):
        model = build_model(quant)  # fresh model: the timers wrap its MoE layers
        wall_s, cpu_s, total_s, phases = run_batch(model, batch, args.steps, np.random.default_rng(1))
        moe = phases["moe_total"]
        gather = moe - phases["experts"] - phases["shared"] - phases["routing"]
        row = {
            "decode_tokens_per_s_wall": batch / wall_s,
            "decode_tokens_per_cpu_s": batch / cpu_s,
            "step_ms_wall": wall_s * 1e3,
            "step_ms_cpu": cpu_s * 1e3,
            "moe_share_of_step": moe / total_s,
            "experts_share_of_moe": phases["experts"] / moe,
            "shared_share_of_moe": phases["shared"] / moe,
            "routing_share_of_moe": phases["routing"] / moe,
            "gather_scatter_share_of_moe": gather / moe,
        }
        results["batches"][batch] = row
        print(
            f"batch {batch:3d}: {row['decode_tokens_per_cpu_s']:7.1f} tok/CPU-s ({row['step_ms_cpu']:6.1f} ms)  "
            f"wall {row['decode_tokens_per_s_wall']:7.1f} tok/s ({row['step_ms_wall']:6.1f} ms)  "
            f"MoE {100 * row['moe_share_of_step']:4.1f}% of step; of MoE: experts "
            f"{100 * row['experts_share_of_moe']:4.1f}%  shared {100 * row['shared_share_of_moe']:4.1f}%  "
            f"routing {100 * row['routing_share_of_moe']:4.1f}%  gather/scatter "
            f"{100 * row['gather_scatter_share_of_moe']:4.1f}%"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
