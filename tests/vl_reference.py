"""transformers' answers for the image tests (tests/server/test_images_*.py) on a tiny Qwen2.5-VL
(tests/tiny_vl.py): its tokenizer and chat template, its image processor, each <|image_pad|> expanded to
the image's merged patch count (what Qwen2_5_VLProcessor does), its model."""

from __future__ import annotations

import io

import torch
import transformers

QUESTION = "what is in the picture?"
MAX_TOKENS = 6


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def load(folder):
    """(model, tokenizer, folder) of the checkpoint, fp32, eager attention."""
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager"
    )
    return model.eval(), transformers.AutoTokenizer.from_pretrained(folder), folder


def hf_inputs(
    hf, messages: list[dict], images, add_generation_prompt: bool = True, **processor_kwargs
) -> dict:
    """input_ids (placeholders expanded), attention mask, pixel values, grids and token types."""
    model, tokenizer, folder = hf
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    image_processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(folder, **processor_kwargs)
    pixels = image_processor(images=list(images), return_tensors="pt")
    merge = image_processor.merge_size**2
    counts = iter(int(g.prod()) // merge for g in pixels["image_grid_thw"])
    pad = model.config.image_token_id
    ids = []
    for t in tokenizer(prompt, add_special_tokens=False)["input_ids"]:
        ids += [pad] * next(counts) if t == pad else [t]
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": pixels["pixel_values"],
        "image_grid_thw": pixels["image_grid_thw"],
        "mm_token_type_ids": (input_ids == pad).int(),
    }


def hf_greedy(hf, images, text: str = QUESTION, **processor_kwargs) -> tuple[list[int], int]:
    """transformers' greedy tokens for one user turn (the images, then the text), and its prompt length."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    inputs = hf_inputs(hf, [{"role": "user", "content": content}], images, **processor_kwargs)
    with torch.no_grad():
        out = hf[0].generate(**inputs, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False)
    n = inputs["input_ids"].shape[1]
    return out[0, n:].tolist(), n


def hf_hidden_states(hf, messages: list[dict], images, **processor_kwargs) -> torch.Tensor:
    """The final-norm hidden state of every prompt token ([tokens, hidden]), the template's prompt
    without a generation prompt (what the pooling routes read)."""
    inputs = hf_inputs(hf, messages, images, add_generation_prompt=False, **processor_kwargs)
    with torch.no_grad():
        out = hf[0].model(**inputs)
    return out.last_hidden_state[0]


def hf_last_hidden(hf, messages: list[dict], images) -> torch.Tensor:
    """The last prompt token's hidden state (an embedding model's LAST pool)."""
    return hf_hidden_states(hf, messages, images)[-1]
