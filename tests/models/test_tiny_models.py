"""The shared test helpers themselves: the tiny tokenizer and the attention-metadata builder."""

from __future__ import annotations

import numpy as np
from tiny_models import TINY_DIMS, make_attention_metadata, write_tiny_tokenizer


def test_tiny_tokenizer_round_trips_and_fits_the_model(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(write_tiny_tokenizer(tmp_path))
    assert len(tok) <= TINY_DIMS["vocab_size"]
    text = "hello world, the answer is 42 — ünïcode too"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges were learned, not just bytes
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>"


def test_make_attention_metadata_layout():
    meta, positions = make_attention_metadata([(0, 3, [5]), (6, 1, [2, 7]), (4, 2, [9, 1])], block_size=4)
    assert positions.numpy().tolist() == [0, 1, 2, 6, 4, 5]
    # slot = block_ids[p // 4] * 4 + p % 4
    assert meta.slot_mapping.numpy().tolist() == [20, 21, 22, 30, 4, 5]
    assert meta.query_start_loc_np.tolist() == [0, 3, 4, 6]
    assert meta.seq_lens_np.tolist() == [3, 7, 6]
    np.testing.assert_array_equal(meta.block_tables.numpy(), [[5, 0], [2, 7], [9, 1]])
    assert (meta.max_query_len, meta.max_seq_len, meta.num_seqs) == (3, 7, 3)
    assert not meta.is_decode_only
