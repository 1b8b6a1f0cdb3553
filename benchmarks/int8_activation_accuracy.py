"""Would AMX-INT8 prompt rows keep the stated accuracy? Measured on SmolLM2-135M's real activations.

    OMP_NUM_THREADS=1 python benchmarks/int8_activation_accuracy.py [--prompts 20] [--tokens 16]

Today's prompt rows (csrc/amx.cc) compute bf16(x) @ bf16(W) in fp32 (kernels/README.md); their stated
rounding is bf16's on each operand, so |y - x @ W^T| <= 2^-8 * sum|x||w| for every output (plus the fp32
summation). Candidates, emulated exactly in benchmarks/int8_emulation.py on the GGUF's own codes:
  bf16        today's path
  int8-row    symmetric int8 activations, one scale per row (vLLM's / oneDNN's dynamic per-token int8)
  int8-block  one scale per row and 32-column block, applied with the weights' block scale
  int16-block the GGUF decode rows' 16-bit fixed point per block (step amax / (127 * 256)), which
              AMX-INT8 would multiply as two int8 planes
Part 1 captures the inputs of every decoder linear (fp32 forward of transformers' model of the GGUF) on
a few chat prompts and reports, per linear type over the 30 layers, the error against the fp32-activation
product: the largest |err| / (2^-8 * sum|x||w|) (<= 1 keeps the bound), the share of outputs over it, the
worst relative rms error and the max |err|. Part 2 runs greedy chat generations whose prompt rows take
each path (generated rows fp32) and compares the first token's logits and the greedy tokens with the
fp32 run; a divergence counts as a near-tie where fp32's top two log-probabilities are within 0.05 nats
(NEAR_TIE_NATS of tests/engine/test_engine_smollm2.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import int8_emulation as emu  # noqa: E402

NEAR_TIE_NATS = 0.05
MODES = {"int8-row": "row", "int8-block": "block", "int16-block": "block16"}
PATHS = ("bf16", "int8-row", "int8-block", "int16-block")
LINEARS = {  # GGUF tensor -> transformers module, per decoder layer
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Explain what a CPU cache is in one sentence.",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 23?",
    "Give me a name for a friendly robot.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "Who wrote Romeo and Juliet?",
    "Suggest a healthy breakfast.",
    "What does HTTP stand for?",
    "Summarize the plot of Cinderella in two sentences.",
    "How many legs does a spider have?",
    "Tell me a fun fact about octopuses.",
    "What is the boiling point of water in Fahrenheit?",
    "Write a short poem about autumn leaves.",
    "What is the difference between a list and a tuple in Python?",
    "Name three planets in our solar system.",
    "How do I make a cup of green tea?",
]


class PromptRowLinear(torch.nn.Module):
    """A decoder linear whose prompt rows (a forward over more than one position) take `path`; generated
    rows stay fp32. With `capture` set, records the fp32 inputs of prompt rows."""

    def __init__(self, inner: torch.nn.Linear):
        super().__init__()
        self.inner, self.path, self.capture = inner, "fp32", None

    def forward(self, x):
        if x.shape[-2] == 1 or self.path == "fp32":
            if self.capture is not None:
                self.capture.append(x.detach().reshape(-1, x.shape[-1]).numpy().copy())
            return self.inner(x)
        w = self.inner.weight
        if self.path == "bf16":
            xq, w = x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float()
        else:
            flat = x.detach().reshape(-1, x.shape[-1]).numpy()
            xq = torch.from_numpy(emu.fake_quant(flat, MODES[self.path])).reshape(x.shape)
        return torch.nn.functional.linear(xq, w, self.inner.bias)


def load():
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fdcli_engine.config import default_model_path

    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    wraps = {}
    for i, layer in enumerate(model.model.layers):
        for gname, hname in LINEARS.items():
            parent, attr = hname.split(".")
            owner = getattr(layer, parent)
            wraps[f"blk.{i}.{gname}"] = PromptRowLinear(getattr(owner, attr))
            setattr(owner, attr, wraps[f"blk.{i}.{gname}"])
    return tok, model, wraps, GGUFReader(path)


def prompt_ids(tok, question: str) -> torch.Tensor:
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return torch.tensor([list(ids)])


def layer_errors(x, raw, qtype, rows_cols):
    """{path: (bound use, share over bound, rel rms, max abs)} of one linear on inputs x [m, k], and under
    "x" how far the rows' largest inputs stand out: (median, max) over rows of max|x| / rms(x)."""
    n, k = rows_cols
    codes, d, mins = emu.parse_blocks(raw, qtype, n, k)
    w = emu.dequantize(codes, d, mins).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    bound = 2.0**-8 * (np.abs(x).astype(np.float64) @ np.abs(w).T)
    got = {
        "bf16": emu.bf16_path(x, w.astype(np.float32)),
        "int8-row": emu.int8_path(x, codes, d, mins, "row"),
        "int8-block": emu.int8_path(x, codes, d, mins, "block"),
        "int16-block": emu.int8_path(x, codes, d, mins, "block16"),
    }
    peak = np.abs(x).max(axis=1) / np.maximum(np.sqrt((x.astype(np.float64) ** 2).mean(axis=1)), 1e-30)
    out = {"x": (float(np.median(peak)), float(peak.max()))}
    for p, y in got.items():
        err = np.abs(y - ref)
        use = err / np.maximum(bound, 1e-30)
        out[p] = (use.max(), (use > 1).mean(), np.linalg.norm(err) / np.linalg.norm(ref), err.max())
    return out


def part1(tok, model, wraps, reader, n_prompts: int) -> None:
    tensors = {t.name: t for t in reader.tensors}
    for wr in wraps.values():
        wr.capture = []
    lm_in = []
    hook = model.lm_head.register_forward_pre_hook(lambda _m, a: lm_in.append(a[0][0].numpy().copy()))
    with torch.no_grad():
        for q in PROMPTS[:n_prompts]:
            model(prompt_ids(tok, q))
    hook.remove()
    rows = {}
    for name, wr in wraps.items():
        x, wr.capture = np.concatenate(wr.capture), None
        t = tensors[name + ".weight"]
        k, n = (int(v) for v in t.shape)
        kind = name.split(".")[-1]
        raw = np.asarray(t.data).view(np.uint8).reshape(n, -1)
        rows.setdefault(f"{kind} ({t.tensor_type.name}, {k}->{n})", []).append(
            layer_errors(x, raw, int(t.tensor_type), (n, k))
        )
    # The tied Q8_0 LM head is not a prompt-row linear (it sees sampled rows only); shown for Q8_0.
    t = tensors["token_embd.weight"]
    k, n = (int(v) for v in t.shape)
    cols = np.random.default_rng(0).choice(n, 4096, replace=False)
    raw = np.asarray(t.data).view(np.uint8).reshape(n, -1)[np.sort(cols)]
    rows["lm_head (Q8_0, 576->4096 of 49152)"] = [
        layer_errors(np.concatenate(lm_in), raw, emu.Q8_0, (4096, k))
    ]
    m = sum(len(r) for r in lm_in)
    print(f"\nPart 1: per-linear error against fp32 activations ({m} prompt rows of {n_prompts} chats)")
    print("bound use = max |err| / (2^-8 sum|x||w|); over = share of outputs past the bound")
    print(f"{'linear':38s} {'path':10s} {'bound use':>9s} {'over':>8s} {'rel rms':>9s} {'max |err|':>9s}")
    for label, per_layer in rows.items():
        peak = np.array([r["x"] for r in per_layer])
        print(
            f"{label:38s} inputs' max|x|/rms(x) per row: median {np.median(peak[:, 0]):.1f}, max {peak[:, 1].max():.1f}"
        )
        for p in PATHS:
            v = np.array([r[p] for r in per_layer])
            print(
                f"{label:38s} {p:10s} {v[:, 0].max():9.3f} {v[:, 1].max():8.2%} {v[:, 2].max():9.2e} {v[:, 3].max():9.2e}"
            )


def answer_logits(model, wraps, ids, path: str) -> np.ndarray:
    """Logits [positions, vocab] of one forward over ids with every row on `path`."""
    for wr in wraps.values():
        wr.path = path
    with torch.no_grad():
        return model(ids).logits[0].float().numpy().astype(np.float64)


def part2(tok, model, wraps, n_prompts: int, tokens: int) -> None:
    """Greedy answers of `tokens` tokens in fp32; then each path scores prompt + answer in one forward
    with every row on the path (teacher-forced): its greedy answer equals fp32's up to token t exactly
    when its argmax is fp32's token at every position up to t."""
    stats = {p: [] for p in ("fp32", *PATHS)}
    for q in PROMPTS[:n_prompts]:
        ids = prompt_ids(tok, q)
        for wr in wraps.values():
            wr.path = "fp32"
        with torch.no_grad():
            seq = model.generate(ids, max_new_tokens=tokens, do_sample=False)
        n_prompt, answer = ids.shape[1], seq[0, ids.shape[1] :].numpy()
        scored = {p: answer_logits(model, wraps, seq[:, :-1], p)[n_prompt - 1 :] for p in stats}
        ref, bf = scored["fp32"], scored["bf16"]
        ref_lp = ref - np.logaddexp.reduce(ref, axis=1, keepdims=True)
        for p, lg in scored.items():
            lp = lg - np.logaddexp.reduce(lg, axis=1, keepdims=True)
            top = lg.argmax(axis=1)
            first = next((i for i in range(len(answer)) if top[i] != answer[i]), None)
            gap = None if first is None else float(np.diff(np.sort(ref[first])[-2:])[0])
            stats[p].append(
                (
                    top[0] == answer[0],
                    top[0] == bf[0].argmax(),
                    np.abs(lg[0] - ref[0]).max(),
                    np.abs(lp[0] - ref_lp[0]).max(),
                    first,
                    gap,
                )
            )
    print(
        f"\nPart 2: {n_prompts} greedy chat answers of {tokens} tokens (fp32), scored with every row on each path"
    )
    print("first = fp32/bf16: first answer token equal; errors on the first token's logits / log-probs")
    print(
        f"{'path':12s} {'first=fp32':>10s} {'=bf16':>6s} {'logit err':>10s} {'logprob err':>11s} {'equal':>6s}  "
        "leaving fp32 at (token:fp32 top-2 gap in nats)"
    )
    for p, rows in stats.items():
        leaves = [f"t{r[4]}:{r[5]:.3f}" for r in rows if r[4] is not None]
        far = sum(r[5] >= NEAR_TIE_NATS for r in rows if r[4] is not None)
        print(
            f"{p:12s} {sum(r[0] for r in rows):7d}/{n_prompts:<2d} {sum(r[1] for r in rows):3d}/{n_prompts:<2d} "
            f"{max(r[2] for r in rows):10.4f} {max(r[3] for r in rows):11.4f} {n_prompts - len(leaves):3d}/{n_prompts:<2d}  "
            f"{far} not at near-ties: " + " ".join(leaves)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=20, help="chat prompts for part 2 (at most 20)")
    ap.add_argument("--capture-prompts", type=int, default=4, help="chat prompts whose rows part 1 uses")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens per answer in part 2")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    t0 = time.time()
    tok, model, wraps, reader = load()
    part1(tok, model, wraps, reader, args.capture_prompts)
    part2(tok, model, wraps, min(args.prompts, len(PROMPTS)), args.tokens)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
