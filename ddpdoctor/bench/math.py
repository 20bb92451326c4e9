"""Byte counts and bus-bandwidth factors, the same as nccl-tests (src/<op>.cu, `*GetCollByteCount`
and `*GetBw`), so that a ddpdoctor number can be put next to an nccl-tests number.

Why bus bandwidth: algbw = bytes / time falls as ranks are added even on perfect hardware, because
an all_reduce moves 2(n-1)/n times the buffer through each rank's link. Multiplying by that factor
gives a number comparable across rank counts and with the hardware's link speed (see
nccl-tests doc/PERFORMANCE.md).
"""

from __future__ import annotations

from dataclasses import dataclass

OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "sendrecv",
)

DTYPE_SIZES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
# nccl-tests' names in the `type` column.
DTYPE_LABELS: dict[str, str] = {"float32": "float", "float16": "half", "bfloat16": "bfloat16"}

# nccl-tests splits all_gather / reduce_scatter / all_to_all buffers into per-rank chunks aligned
# to 16 bytes.
CHUNK_ALIGN_BYTES = 16

_REDUCING = {"all_reduce", "reduce", "reduce_scatter", "sendrecv"}  # nccl-tests prints "sum" for these
_ROOTED = {"broadcast", "reduce"}
_CHUNKED = {"all_gather", "reduce_scatter", "all_to_all"}


@dataclass(frozen=True)
class CollCounts:
    """Element counts of one operation at one requested size.

    `count` is the count argument of the NCCL call (per rank for chunked ops), `size_bytes` the
    full buffer (the larger of send and receive), as in nccl-tests' `size` and `count` columns.
    """

    op: str
    nranks: int
    elt_size: int
    count: int
    send_count: int
    recv_count: int

    @property
    def size_bytes(self) -> int:
        return max(self.send_count, self.recv_count) * self.elt_size


def coll_counts(op: str, size_bytes: int, elt_size: int, nranks: int) -> CollCounts:
    """Counts for `op` at a requested size, rounded like nccl-tests does."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    if nranks < 1 or elt_size < 1:
        raise ValueError("nranks and elt_size must be positive")
    total = size_bytes // elt_size
    if op in _CHUNKED:
        align = max(CHUNK_ALIGN_BYTES // elt_size, 1)
        per_rank = (total // nranks) // align * align
        if op == "all_gather":
            return CollCounts(op, nranks, elt_size, per_rank, per_rank, per_rank * nranks)
        if op == "reduce_scatter":
            return CollCounts(op, nranks, elt_size, per_rank, per_rank * nranks, per_rank)
        return CollCounts(op, nranks, elt_size, per_rank, per_rank * nranks, per_rank * nranks)
    return CollCounts(op, nranks, elt_size, total, total, total)


def rank_buffer_bytes(op: str, size_bytes: int, elt_size: int, nranks: int, check: bool = True) -> int:
    """Bytes one rank allocates for `op` at a requested size: its send and receive buffers (one buffer
    for the in-place ops), plus, with the correctness check, the expected values and the int64 index
    they are built from (bench/worker.py `_Case`, `pattern`)."""
    c = coll_counts(op, size_bytes, elt_size, nranks)
    inplace = op in ("all_reduce", "broadcast", "reduce")
    total = c.send_count * elt_size if inplace else (c.send_count + c.recv_count) * elt_size
    if check:
        total += c.recv_count * (elt_size + 8)
    return total


def bus_factor(op: str, nranks: int) -> float:
    """busbw / algbw: 2(n-1)/n for all_reduce; (n-1)/n for all_gather, reduce_scatter, all_to_all; 1 else."""
    if op == "all_reduce":
        return 2.0 * (nranks - 1) / nranks
    if op in _CHUNKED:
        return (nranks - 1) / nranks
    if op in OPS:
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def algbw_bytes(counts: CollCounts) -> int:
    """Bytes that algbw divides by: the full buffer (count x nranks for the chunked ops)."""
    if counts.op in _CHUNKED:
        return counts.count * counts.nranks * counts.elt_size
    return counts.count * counts.elt_size


def bandwidths(counts: CollCounts, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second, as nccl-tests); (0, 0) for a zero time."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = algbw_bytes(counts) / 1e9 / seconds
    return algbw, algbw * bus_factor(counts.op, counts.nranks)


def redop_label(op: str) -> str:
    return "sum" if op in _REDUCING else "none"


def root_of(op: str) -> int:
    """Root rank as printed by nccl-tests: 0 for broadcast and reduce, -1 for the others."""
    return 0 if op in _ROOTED else -1
