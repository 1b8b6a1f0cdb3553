"""Time to first token of ERNIE-4.5-VL for one image + a short text, fd against transformers in the
same run, on a random checkpoint (no real VL weights are available offline) with a realistic image.

The checkpoint is made with transformers (Ernie4_5_VLMoeForConditionalGeneration, random weights,
dims from the flags; the defaults are a scaled-down ERNIE-4.5-VL) in a temporary folder. For one
--image-size x --image-size picture and --text-tokens text tokens it reports (median of --repeats):
- fd: TTFT through the offline LLM (max_tokens 1, prefix caching off), the image processor's time
  and the vision encoder's (tower + resampler) time, i.e. their shares of the TTFT; and the TTFT of
  the same request with prefix caching on, after a first run of it (the image's blocks cached);
- transformers: its image processor and a one-token generate, eager attention, fp32.

    python benchmarks/bench_ernie_vl.py [--image-size 448] [--text-tokens 32] [--repeats 3]
                                        [--vision-dim 256] [--vision-depth 4] [--hidden 512]
                                        [--layers 4] [--experts 16] [--quantization wint8|wint4]
                                        [--json out.json]
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


def build_checkpoint(folder: Path, args) -> None:
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


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_fd(folder: Path, image, text: str, repeats: int, quantization: str | None) -> dict:
    from fdcli_engine import LLM, SamplingParams  # noqa: PLC0415
    from fdcli_engine.multimodal.processor import get_image_processor  # noqa: PLC0415

    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    cold = LLM(str(folder), max_model_len=2048, enable_prefix_caching=False, quantization=quantization)
    prompt = {"prompt": text, "multi_modal_data": {"image": image}}
    cold.generate(prompt, one)  # warm-up: kernels, allocator
    proc = get_image_processor(cold.config.hf_config, cold.config.model_path)
    ids = cold.tokenizer.encode(text, add_special_tokens=False)
    out = {"ttft_s": median_time(lambda: cold.generate(prompt, one), repeats)}
    out["processor_s"] = median_time(lambda: proc.process(ids, [image]), repeats)
    _, feats = proc.process(ids, [image])
    out["encoder_s"] = median_time(lambda: cold.engine.model.embed_images(feats), repeats)
    out["image_tokens"] = feats[0].length
    warm = LLM(str(folder), max_model_len=2048, enable_prefix_caching=True, quantization=quantization)
    warm.generate(prompt, one)  # the image's blocks enter the cache
    out["ttft_cached_image_s"] = median_time(lambda: warm.generate(prompt, one), repeats)
    return out


def bench_transformers(folder: Path, image, text: str, repeats: int) -> dict:
    import numpy as np  # noqa: PLC0415
    import tiny_ernie_vl  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415
    from transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe import (  # noqa: PLC0415
        Ernie4_5_VLMoeImageProcessorPil,
    )

    tokens = tiny_ernie_vl.ERNIE_VL_TOKENS
    start, end, img = tokens["image_start_token_id"], tokens["image_end_token_id"], tokens["image_token_id"]
    hf = tiny_ernie_vl.load_hf_ernie_vl(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    proc = Ernie4_5_VLMoeImageProcessorPil()

    def first_token():
        px = proc(images=[image], return_tensors="np")
        n = int(np.prod(px["image_grid_thw"][0])) // 4
        ids = [
            t for i in tok.encode(text, add_special_tokens=False) for t in ([img] * n if i == img else [i])
        ]
        arr = np.asarray(ids)
        with torch.no_grad():
            hf.generate(
                torch.tensor([ids]),
                max_new_tokens=1,
                do_sample=False,
                pixel_values=torch.tensor(px["pixel_values"]),
                image_grid_thw=torch.tensor(px["image_grid_thw"]),
                mm_token_type_ids=torch.tensor((arr == img).astype(np.int64)[None]),
                moe_mm_token_type_ids=torch.tensor(np.isin(arr, (start, end, img)).astype(np.int64)[None]),
            )

    first_token()
    return {
        "ttft_s": median_time(first_token, repeats),
        "processor_s": median_time(lambda: proc(images=[image], return_tensors="np"), repeats),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--text-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vision-dim", type=int, default=256)
    p.add_argument("--vision-depth", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument(
        "--quantization", choices=["wint8", "wint4"], default=None, help="fd's weights (default fp32)"
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (args.image_size, args.image_size, 3), dtype=np.uint8))
    words = " ".join(["answer"] * args.text_tokens)
    text = f"<|im_start|>user\n<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>{words}<|im_end|>\n<|im_start|>assistant\n"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_checkpoint(folder, args)
        result = {
            "args": vars(args) | {"json": str(args.json) if args.json else None},
            "fd": bench_fd(folder, image, text, args.repeats, args.quantization),
            "transformers": bench_transformers(folder, image, text, args.repeats),
        }
    fd = result["fd"]
    fd["processor_share"] = fd["processor_s"] / fd["ttft_s"]
    fd["encoder_share"] = fd["encoder_s"] / fd["ttft_s"]
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
