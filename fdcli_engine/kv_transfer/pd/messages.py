"""The frames of one prefill → decode transfer: msgspec msgpack, typed, never pickle.

A transfer is a `TransferStart` (the prompt it belongs to and the layout of its blocks), then one
`TransferBlock` per full prompt block in order, then a `TransferEnd`. Every frame carries the shared
token (checked with hmac.compare_digest by the receiver) and the transfer id the router chose.
"""

from __future__ import annotations

import msgspec


class TransferStart(msgspec.Struct, tag="start"):
    transfer_id: str
    token: str
    prompt_token_ids: list[int]
    num_blocks: int
    block_size: int
    # One "dtype[shape]" per cache tensor part of a block: the receiver refuses another layout.
    part_specs: list[str]


class TransferBlock(msgspec.Struct, tag="block"):
    transfer_id: str
    token: str
    index: int
    parts: list[bytes]


class TransferEnd(msgspec.Struct, tag="end"):
    transfer_id: str
    token: str


Frame = TransferStart | TransferBlock | TransferEnd

ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(Frame)


def part_specs(arrays) -> list[str]:
    """The layout of one block of these cache tensors (views, block id first)."""
    return [f"{a.dtype.str}{list(a.shape[1:])}" for a in arrays]
