"""Weights on 2 MB pages, once, after the model is loaded (the KV caches are allocated on them:
runner/kv_cache.py).

Every decode step streams all the weights the kernels read (packed linears, the LM head, the AMX tiles
of prompt rows); `ops.huge_pages` moves their memory onto transparent huge pages in place
(fd_kernels/native/thp.py). The tensors are found by walking the model's objects, so every
architecture and every packing is covered without a list to keep in step with them.
"""

from __future__ import annotations

import logging

import paddle

from fdcli_engine import ops

logger = logging.getLogger(__name__)

_OWN_MODULES = ("fdcli_engine", "fd_kernels")


def resident_tensors(*roots) -> list[paddle.Tensor]:
    """Every Paddle tensor reachable from `roots` through lists, tuples, dicts and the attributes of
    fd's own objects (models, layers, packed weights); each once."""
    seen: set[int] = set()
    found: list[paddle.Tensor] = []
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, paddle.Tensor):
            found.append(obj)
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith(_OWN_MODULES) or isinstance(obj, paddle.nn.Layer):
            stack.extend(getattr(obj, "__dict__", {}).values())
    return [t for t in found if t.place.is_cpu_place() and int(t.numel()) > 0]


def place_on_huge_pages(*roots) -> int:
    """Back the tensors under `roots` with 2 MB pages; returns the bytes now on huge pages."""
    tensors = resident_tensors(*roots)
    done = ops.huge_pages(tensors)
    total = sum(int(t.numel()) * t.element_size() for t in tensors)
    logger.info(
        "huge pages: %.1f MiB now on 2 MB pages, around %.1f MiB of weights", done / 2**20, total / 2**20
    )
    return done
