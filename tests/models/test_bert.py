"""BertModel (embedding encoder) against transformers: last hidden states of a varlen batch, atol 1e-4
(tiny random model) / 2e-4 (all-MiniLM-L6-v2, real weights, marked slow)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import load_fd_model, make_attention_metadata, make_tiny_bert

from fdcli_engine.errors import InvalidRequestError

SEQS = [[101, 7, 300, 45, 9, 102], [101, 250, 102], [101, 12, 13, 14, 15, 16, 17, 18, 19, 102]]


def fd_hidden(model, seqs):
    import paddle

    meta, positions = make_attention_metadata([(0, len(s), [0]) for s in seqs], block_size=16)
    ids = paddle.to_tensor(np.concatenate(seqs).astype(np.int64))
    return model.forward(ids, positions, [], meta).numpy()


def hf_hidden(folder, seqs):
    from transformers import AutoModel

    hf = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return np.concatenate([hf(torch.tensor([s])).last_hidden_state[0].numpy() for s in seqs])


def test_tiny_bert_varlen_batch_matches_transformers(tmp_path):
    folder = make_tiny_bert(tmp_path)
    model = load_fd_model(folder)
    np.testing.assert_allclose(fd_hidden(model, SEQS), hf_hidden(folder, SEQS), atol=1e-4, rtol=0)


def test_encoder_rejects_chunked_sequences(tmp_path):
    import paddle

    model = load_fd_model(make_tiny_bert(tmp_path))
    meta, positions = make_attention_metadata([(3, 2, [0])], block_size=16)
    with pytest.raises(InvalidRequestError, match="whole in one step"):
        model.forward(paddle.to_tensor(np.array([5, 6], dtype=np.int64)), positions, [], meta)
    with pytest.raises(InvalidRequestError, match="no token logits"):
        model.compute_logits(None)


@pytest.mark.slow
def test_minilm_matches_transformers():
    from fdcli_engine.config import default_embedding_model_path

    folder = default_embedding_model_path()
    model = load_fd_model(folder)
    assert (model.num_layers, model.hidden_size) == (6, 384)
    got, expected = fd_hidden(model, SEQS), hf_hidden(folder, SEQS)
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=0)
