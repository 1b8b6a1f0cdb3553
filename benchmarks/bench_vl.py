"""Time to first token of an image request: fd (offline LLM) against transformers in the same run, on a
tiny random Qwen2.5-VL checkpoint (no real VL weights are available offline) with a realistic picture.

    python benchmarks/bench_vl.py [--size 448] [--text-tokens 32] [--repeats 5]

One request: one SIZExSIZE picture (Qwen's pixel budget: 448x448 -> 256 image tokens) and about
TEXT_TOKENS text tokens, max_tokens=1. Reported medians over the repeats, each with a fresh picture
(nothing cached): fd's whole TTFT, and inside it the image processor's and the vision encoder's share
(each timed alone on the same picture); fd's TTFT for the same request again with the picture already
in the prefix cache (the encoder does not run); transformers' processor + generate(max_new_tokens=1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--text-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import tiny_vl  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    from fdcli_engine import LLM, SamplingParams  # noqa: PLC0415

    folder = tiny_vl.make_tiny_qwen2_5_vl(Path(tempfile.mkdtemp()) / "qwen2_5_vl", max_pixels=28 * 28 * 1280)
    llm = LLM(str(folder), max_model_len=512, num_kv_blocks=256)
    text = llm.tokenizer.encode(" ".join(["the quick brown fox jumps over the lazy dog"] * args.text_tokens))
    head = llm.tokenizer.encode("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>")
    ids = head + text[: args.text_tokens] + llm.tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n")
    one = SamplingParams(temperature=0, max_tokens=1)
    proc, model = llm.image_processor, llm.engine.model
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder).eval()
    hf_ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
    pad = hf.config.image_token_id

    def hf_ttft(image):
        """transformers: its image processor, the placeholder expanded, generate(max_new_tokens=1)."""
        pp = hf_ip(images=[image], return_tensors="pt")
        n = int(pp["image_grid_thw"][0].prod()) // 4
        full = [t for i in ids for t in ([pad] * n if i == pad else [i])]
        t = torch.tensor([full])
        with torch.no_grad():
            hf.generate(
                input_ids=t,
                attention_mask=torch.ones_like(t),
                pixel_values=pp["pixel_values"],
                image_grid_thw=pp["image_grid_thw"],
                mm_token_type_ids=(t == pad).int(),
                max_new_tokens=1,
                do_sample=False,
                pad_token_id=0,
            )

    rows = {"fd TTFT": [], "fd processor": [], "fd encoder": [], "fd TTFT cached": [], "hf TTFT": []}
    for r in range(args.repeats + 1):  # the first round warms up and is dropped
        image = tiny_vl.random_image(args.size, args.size, seed=r)
        request = {"prompt_token_ids": ids, "multi_modal_data": {"image": image}}
        t_proc, (_, feats) = timed(proc.process, list(ids), [image])
        t_enc, _ = timed(model.embed_images, feats)
        t_fd, _ = timed(llm.generate, request, one)
        t_cached, out = timed(llm.generate, request, one)
        assert out[0].num_cached_tokens > feats[0].length, "the second request should hit the prefix cache"

        t_hf, _ = timed(hf_ttft, image)
        if r:
            for key, value in zip(rows, (t_fd, t_proc, t_enc, t_cached, t_hf)):
                rows[key].append(value)
    print(
        f"one {args.size}x{args.size} image ({feats[0].length} tokens) + {args.text_tokens} text tokens (+ chat markup), "
        f"median of {args.repeats}, torch threads {torch.get_num_threads()}"
    )
    for key, values in rows.items():
        print(f"  {key:16s} {statistics.median(values) * 1e3:9.2f} ms")
    fd_ttft = statistics.median(rows["fd TTFT"])
    for key in ("fd processor", "fd encoder"):
        print(f"  {key} share of fd TTFT: {statistics.median(rows[key]) / fd_ttft:.0%}")


if __name__ == "__main__":
    main()
