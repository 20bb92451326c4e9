"""Objects over torch.distributed without pickle or numpy: JSON bytes in uint8 tensors.

torch's gather_object/all_gather_object pickle (loading a pickle from another node runs its code)
and, in recent torch, need numpy to turn tensors back into bytes; neither is acceptable on a node
being diagnosed. Sizes are exchanged first, payloads are padded to the largest, then cut back.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, Optional


def _to_tensor(data: bytes) -> Any:
    import torch

    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _to_bytes(tensor: Any, length: int) -> bytes:
    chunk = tensor[:length].contiguous()
    return ctypes.string_at(chunk.data_ptr(), length) if length else b""


def _padded(data: bytes, group: Any) -> tuple[Any, list[int]]:
    """(this rank's bytes padded to the longest, every rank's length): one all_gather of sizes."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(max(lengths), 1), dtype=torch.uint8)
    if data:
        padded[: len(data)] = _to_tensor(data)
    return padded, lengths


def encode(obj: Any) -> bytes:
    return json.dumps(obj, default=str, separators=(",", ":")).encode("utf-8")


def decode(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return None


def gather_json(obj: Any, dst: int = 0, group: Any = None) -> Optional[list[Any]]:
    """Every rank's JSON-able obj on rank `dst` (a list by rank), None on the others."""
    import torch
    import torch.distributed as dist

    padded, lengths = _padded(encode(obj), group)
    rank = dist.get_rank(group)
    bufs = [torch.empty_like(padded) for _ in lengths] if rank == dst else None
    dist.gather(padded, bufs, dst=dst, group=group)
    if bufs is None:
        return None
    return [decode(_to_bytes(b, n)) for b, n in zip(bufs, lengths)]


def all_gather_json(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's JSON-able obj on every rank, by rank."""
    import torch
    import torch.distributed as dist

    padded, lengths = _padded(encode(obj), group)
    bufs = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(bufs, padded, group=group)
    return [decode(_to_bytes(b, n)) for b, n in zip(bufs, lengths)]
