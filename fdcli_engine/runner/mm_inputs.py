"""The multimodal part of a step's model inputs: image rows and M-RoPE positions.

A model that takes images offers `embed_images(features)` and `mm_positions(prompt_token_ids,
features)` (see models/qwen2_5_vl.py). Per request, the vision encoder runs once per image, the first
time a step's tokens overlap that image's placeholder range, and its rows are kept until the request
finishes (a later chunk of the same image, or a recompute after preemption, reuses them). A chunk may
start or end inside an image: only the overlapping rows go in.

Positions: a request with images has three positions per prompt token (text continues after an
image's largest position) and, past its prompt, index + delta for all three (delta = the prompt's
largest position + 1 - its length). A step whose rows all have three equal positions stays 1-D
(int64 [T], the decoder stack's path); one holding an image's tokens passes int64 [3, T], text rows
repeated. A step without any image request returns the plain inputs untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import paddle

from fdcli_engine.step_types import ScheduledRequest


@dataclass
class _RequestState:
    positions: np.ndarray  # int64 [3, num_prompt_tokens]
    delta: int
    rows: dict[int, paddle.Tensor] = field(default_factory=dict)  # feature index -> encoder rows


class MultiModalInputs:
    def __init__(self, model):
        self.model = model
        self.enabled = hasattr(model, "embed_images") and hasattr(model, "mm_positions")
        self._states: dict[str, _RequestState] = {}
        self.num_encoded_images = 0  # encoder runs, one per image per request (tests, metrics)

    def drop(self, req_ids) -> None:
        for rid in req_ids:
            self._states.pop(rid, None)

    def _state(self, s: ScheduledRequest) -> _RequestState:
        st = self._states.get(s.req_id)
        if st is None:
            positions, delta = self.model.mm_positions(s.prompt_token_ids, s.mm_features)
            st = self._states[s.req_id] = _RequestState(positions, delta)
        return st

    def _encode_missing(self, wanted: list[tuple[_RequestState, int, object]]) -> None:
        """Run the encoder once over every image this step needs and no request holds yet."""
        todo = [(st, i, f) for st, i, f in wanted if i not in st.rows]
        if not todo:
            return
        for (st, i, _), rows in zip(todo, self.model.embed_images([f for _, _, f in todo])):
            st.rows[i] = rows
        self.num_encoded_images += len(todo)

    def prepare(
        self, scheduled: list[ScheduledRequest], positions: paddle.Tensor, query_start_loc: np.ndarray
    ):
        """(positions, mm_embeds or None) for the model's forward."""
        if not self.enabled or not any(s.mm_features for s in scheduled):
            return positions, None
        pos1 = positions.numpy()
        spans: list[tuple[int, np.ndarray]] = []
        wanted, placed = [], []
        for s, first_row in zip(scheduled, query_start_loc):
            if not s.mm_features:
                continue
            st = self._state(s)
            start, end = s.num_computed_tokens, s.num_computed_tokens + len(s.token_ids)
            idx = np.arange(start, end)
            pos = np.broadcast_to(idx + st.delta, (3, len(idx))).copy()
            in_prompt = idx < st.positions.shape[1]
            pos[:, in_prompt] = st.positions[:, idx[in_prompt]]
            spans.append((int(first_row), pos))
            for i, f in enumerate(s.mm_features):
                lo, hi = max(start, f.offset), min(end, f.end)
                if lo < hi:
                    wanted.append((st, i, f))
                    placed.append((st, i, int(first_row) + lo - start, lo - f.offset, hi - f.offset))
        self._encode_missing(wanted)
        if any((pos[0] != pos[1:]).any() for _, pos in spans):
            full = np.tile(pos1, (3, 1))
            for a, pos in spans:
                full[:, a : a + pos.shape[1]] = pos
            positions = paddle.to_tensor(full)
        else:
            for a, pos in spans:
                pos1[a : a + pos.shape[1]] = pos[0]
            positions = paddle.to_tensor(pos1)
        if not placed:
            return positions, None
        index = np.concatenate([np.arange(row, row + hi - lo) for _, _, row, lo, hi in placed])
        values = [st.rows[i][lo:hi] for st, i, _, lo, hi in placed]
        return positions, (paddle.to_tensor(index), values[0] if len(values) == 1 else paddle.concat(values))
