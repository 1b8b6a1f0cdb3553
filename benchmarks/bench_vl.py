"""Time to first token of one image request, fd against transformers in the same run, on a random
vision-language checkpoint (no real VL weights are available offline) with a realistic picture.

--model-kind picks the architecture:
- qwen2_5_vl (default): the tests' tiny Qwen2.5-VL (tests/tiny_vl.py) with Qwen's own pixel budget
  (448x448 -> 256 image tokens);
- ernie4_5_vl: ERNIE-4.5-VL made with transformers (tests/tiny_ernie_vl.py) at the dims of the
  --vision-* / --hidden / --layers / --experts flags (the defaults are a scaled-down ERNIE-4.5-VL).

For one --image-size x --image-size picture and about --text-tokens text tokens (+ chat markup) it
reports (median of --repeats, after a warm-up):
- fd: TTFT through the offline LLM (max_tokens 1, prefix caching off), the image processor's and the
  vision encoder's time, i.e. their shares of the TTFT; and the TTFT of the same request with prefix
  caching on, after a first run of it (the image's blocks cached, the encoder does not run);
- transformers: its image processor and a one-token generate, eager attention, fp32.

    python benchmarks/bench_vl.py [--model-kind qwen2_5_vl|ernie4_5_vl] [--image-size 448]
                                  [--text-tokens 32] [--repeats 3] [--quantization wint8|wint4]
                                  [--json out.json]  (the figures as JSON too)
                                  ernie4_5_vl only: [--vision-dim 256] [--vision-depth 4]
                                  [--hidden 512] [--layers 4] [--experts 16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

WORDS = "the quick brown fox jumps over the lazy dog"


class Qwen2_5_VL:
    image_markup = "<|vision_start|><|image_pad|><|vision_end|>"
    max_model_len = 512  # the tiny checkpoint's limit
    uses_dims = False  # the tests' tiny dims

    def build(self, folder: Path, args) -> None:
        import tiny_vl  # noqa: PLC0415 - the tests' builder

        tiny_vl.make_tiny_qwen2_5_vl(folder, max_pixels=28 * 28 * 1280)

    def transformers_side(self, folder: Path):
        """(one-token generate of a prompt text with one image, the image processor alone)."""
        import torch  # noqa: PLC0415
        import transformers  # noqa: PLC0415

        hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
            folder, attn_implementation="eager"
        ).eval()
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        ip = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder)
        pad = hf.config.image_token_id

        def first_token(text, image):
            pp = ip(images=[image], return_tensors="pt")
            n = int(pp["image_grid_thw"][0].prod()) // 4
            ids = [
                t
                for i in tok.encode(text, add_special_tokens=False)
                for t in ([pad] * n if i == pad else [i])
            ]
            t = torch.tensor([ids])
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

        return first_token, lambda image: ip(images=[image], return_tensors="pt")


class Ernie4_5_VL:
    image_markup = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
    max_model_len = 2048
    uses_dims = True  # ERNIE_DIMS

    def build(self, folder: Path, args) -> None:
        import tiny_ernie_vl  # noqa: PLC0415 - the tests' builder, with bigger dims

        heads = max(1, args.hidden // 64)
        tiny_ernie_vl.VISION.update(
            depth=args.vision_depth,
            hidden_size=args.vision_dim,
            num_heads=max(1, args.vision_dim // 64),
            intermediate_size=4 * args.vision_dim,
        )
        tiny_ernie_vl.TEXT.update(
            hidden_size=args.hidden,
            intermediate_size=3 * args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 4),
            head_dim=64,
            moe_num_experts=args.experts,
            moe_k=min(6, args.experts),
            moe_intermediate_size=[args.hidden, args.hidden // 2],
            mlp_layer_types=["dense"] + ["sparse"] * (args.layers - 1),
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [11, 11, 10]},
        )
        tiny_ernie_vl.make_tiny_ernie_vl(folder)

    def transformers_side(self, folder: Path):
        import tiny_ernie_vl  # noqa: PLC0415
        import torch  # noqa: PLC0415
        from transformers import AutoTokenizer  # noqa: PLC0415

        hf = tiny_ernie_vl.load_hf_ernie_vl(folder)
        tok = AutoTokenizer.from_pretrained(folder)

        def first_token(text, image):
            px = tiny_ernie_vl.hf_pixels([image])
            ids = tiny_ernie_vl.expand_placeholders(tok.encode(text, add_special_tokens=False), px)
            with torch.no_grad():
                hf.generate(
                    torch.tensor([ids]),
                    max_new_tokens=1,
                    do_sample=False,
                    **tiny_ernie_vl.hf_image_kwargs(ids, px),
                )

        return first_token, lambda image: tiny_ernie_vl.hf_pixels([image])


ERNIE_DIMS = ("vision_dim", "vision_depth", "hidden", "layers", "experts")
MODEL_KINDS = {"qwen2_5_vl": Qwen2_5_VL, "ernie4_5_vl": Ernie4_5_VL}


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_fd(kind, folder: Path, image, text: str, repeats: int, quantization: str | None) -> dict:
    from fdcli_engine import LLM, SamplingParams  # noqa: PLC0415
    from fdcli_engine.multimodal.processor import get_image_processor  # noqa: PLC0415

    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    cold = LLM(
        str(folder), max_model_len=kind.max_model_len, enable_prefix_caching=False, quantization=quantization
    )
    prompt = {"prompt": text, "multi_modal_data": {"image": image}}
    cold.generate(prompt, one)  # warm-up: kernels, allocator
    proc = get_image_processor(cold.config.hf_config, cold.config.model_path)
    ids = cold.tokenizer.encode(text, add_special_tokens=False)
    out = {"ttft_s": median_time(lambda: cold.generate(prompt, one), repeats)}
    out["processor_s"] = median_time(lambda: proc.process(ids, [image]), repeats)
    _, feats = proc.process(ids, [image])
    out["encoder_s"] = median_time(lambda: cold.engine.model.embed_images(feats), repeats)
    out["image_tokens"] = feats[0].length
    warm = LLM(
        str(folder), max_model_len=kind.max_model_len, enable_prefix_caching=True, quantization=quantization
    )
    warm.generate(prompt, one)  # the image's blocks enter the cache
    out["ttft_cached_image_s"] = median_time(lambda: warm.generate(prompt, one), repeats)
    (last,) = warm.generate(prompt, one)
    assert last.num_cached_tokens > feats[0].length, "the repeated request should hit the prefix cache"
    return out


def bench_transformers(kind, folder: Path, image, text: str, repeats: int) -> dict:
    first_token, processor = kind.transformers_side(folder)
    first_token(text, image)  # warm-up
    return {
        "ttft_s": median_time(lambda: first_token(text, image), repeats),
        "processor_s": median_time(lambda: processor(image), repeats),
    }


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-kind", choices=sorted(MODEL_KINDS), default="qwen2_5_vl")
    p.add_argument("--image-size", "--size", type=int, default=448)
    p.add_argument("--text-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--quantization", choices=["wint8", "wint4"], default=None, help="fd's weights (default fp32)"
    )
    p.add_argument("--json", type=Path)
    ernie = p.add_argument_group("ernie4_5_vl dims")
    ernie.add_argument("--vision-dim", type=int, default=256)
    ernie.add_argument("--vision-depth", type=int, default=4)
    ernie.add_argument("--hidden", type=int, default=512)
    ernie.add_argument("--layers", type=int, default=4)
    ernie.add_argument("--experts", type=int, default=16)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import tiny_models  # noqa: PLC0415

    kind = MODEL_KINDS[args.model_kind]()
    image = tiny_models.random_image(args.image_size, args.image_size, seed=0)
    words = " ".join([WORDS] * args.text_tokens).split()[: args.text_tokens]
    text = f"<|im_start|>user\n{kind.image_markup}{' '.join(words)}<|im_end|>\n<|im_start|>assistant\n"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        kind.build(folder, args)
        result = {
            "args": {k: v for k, v in vars(args).items() if kind.uses_dims or k not in ERNIE_DIMS}
            | {"json": str(args.json) if args.json else None},
            "fd": bench_fd(kind, folder, image, text, args.repeats, args.quantization),
            "transformers": bench_transformers(kind, folder, image, text, args.repeats),
        }
    fd = result["fd"]
    fd["processor_share"] = fd["processor_s"] / fd["ttft_s"]
    fd["encoder_share"] = fd["encoder_s"] / fd["ttft_s"]
    print_summary(args.model_kind, result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


def print_summary(model_kind: str, result: dict) -> None:
    fd, hf = result["fd"], result["transformers"]
    print(f"{model_kind}: one {result['args']['image_size']}px image ({fd['image_tokens']} image tokens)")
    print(f"  {'':26s} {'transformers':>12s} {'fd':>9s} {'tr./fd':>7s}")
    for name, key in (("TTFT", "ttft_s"), ("image processor", "processor_s")):
        print(f"  {name:26s} {hf[key] * 1e3:9.1f} ms {fd[key] * 1e3:6.1f} ms {hf[key] / fd[key]:6.2f}x")
    print(f"  {'vision encoder':26s} {'':12s} {fd['encoder_s'] * 1e3:6.1f} ms")
    print(
        f"  processor / encoder share of fd's TTFT: {fd['processor_share']:.0%} / {fd['encoder_share']:.0%}"
    )
    cached = fd["ttft_cached_image_s"]
    print(f"  TTFT with the image cached: {cached * 1e3:.1f} ms ({cached / fd['ttft_s']:.2f}x uncached)")


if __name__ == "__main__":
    main()
