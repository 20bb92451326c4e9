"""Flight Recorder dumps: bytes in, plain dataclasses out. Pure; reading the files is probe_io's job.

torch writes a dump per rank (`TORCH_FR_DUMP_TEMP_FILE=<prefix>` + rank, or on demand with
`torch._C._distributed_c10d._dump_fr_trace()` / `_dump_fr_trace_json()`). The pickle holds only dicts,
lists, tuples, strings, numbers, booleans and None, so it is read here with a restricted unpickler that
can build nothing else: a dump from someone else's job must never run code on the machine that reads it.

Real structure (torch 2.13, gloo; the JSON form has no `frames` and strings for pg_status counters):
`{"version": "2.10", "pg_config": {name: {"name", "desc", "ranks": "[0, 1]"}}, "pg_status": {pg_id:
{"last_enqueued_collective", "last_started_collective", "last_completed_collective"}}, "entries":
[{"pg_id", "process_group": (pg_id, name), "collective_seq_id", "p2p_seq_id", "is_p2p",
"profiling_name": "gloo:all_reduce", "input_sizes", "input_dtypes", "output_sizes", "state",
"retired", "frames": [{"filename", "line", "name"}], ...}]}`. Newer dumps may carry "rank".
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

from ddpdoctor.parsers.numbers import parse_int

# A dump holds at most TORCH_FR_BUFFER_SIZE entries; anything past these bounds is not a dump.
MAX_DUMP_BYTES = 256 * 1024 * 1024
MAX_ENTRIES = 1_000_000
# A pickle's memo lets a small file name one entry a million times (600 KB expanded to 2.5 GB and 44 s):
# the objects a dump is built into are counted as they are built, against this budget (a real dump of
# 2000 entries with 30 frames each spends ~70k). Frames: at most this many read per entry, and only
# those up to the first user frame kept (the only one used).
MAX_BUILT_OBJECTS = 1_000_000
MAX_FRAMES_READ = 64
MAX_FRAMES_KEPT = 16


class Budget:
    """Objects left to build; DumpError once spent (shared by the dumps of one directory)."""

    def __init__(self, limit: int = MAX_BUILT_OBJECTS) -> None:
        self.limit = limit
        self.left = limit

    def spend(self, n: int = 1) -> None:
        self.left -= n
        if self.left < 0:
            raise DumpError(
                f"expands to more than {self.limit} objects (shared references in the pickle): "
                "larger than any Flight Recorder dump torch writes"
            )


class DumpError(ValueError):
    """The bytes are not a Flight Recorder dump we can read (the message says why)."""


class _Refusing:
    """Builds only containers and scalars: any class or function reference is refused.

    Protocol opcodes for dict/list/tuple/str/bytes/int/float/bool/None need no global lookup; every
    other object needs `find_class`, which refuses. REDUCE/BUILD/INST/OBJ cannot run without a class.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(
            f"refused: the pickle asks for {module}.{name}; a Flight Recorder dump holds only plain "
            "containers and scalars, so this file is not one (it could run code if loaded with pickle.load)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("refused: the pickle uses persistent ids; a Flight Recorder dump does not")


class _PlainUnpickler(_Refusing, pickle.Unpickler):
    """The C unpickler, for pickles small enough that whatever they build is bounded by their size."""


# One opcode byte builds one object: `}` an empty dict (~90 bytes with its slot), so a 16 MB pickle of
# `}` is 1.4 GB. Up to FAST_PICKLE_BYTES the C unpickler is used (at most ~200 MB whatever it holds);
# a larger pickle is unpickled by the Python unpickler with every object it builds counted as it is
# built, in units of ~30 bytes (a container 3, a string, number, memo entry or reference 1), and
# refused past MAX_PICKLE_UNITS (~250 MB). A real dump of 20000 entries with 30 frames each spends ~6.6M.
FAST_PICKLE_BYTES = 2 * 1024 * 1024
MAX_PICKLE_UNITS = 8_000_000
_FREE_OPCODES = frozenset(
    op[0] for op in (pickle.MARK, pickle.STOP, pickle.PROTO, pickle.FRAME, pickle.APPEND, pickle.APPENDS,
                     pickle.SETITEM, pickle.SETITEMS, pickle.POP, pickle.POP_MARK)
)
_CONTAINER_OPCODES = frozenset(
    op[0] for op in (pickle.EMPTY_DICT, pickle.EMPTY_LIST, pickle.EMPTY_TUPLE, pickle.DICT, pickle.LIST,
                     pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3, pickle.EMPTY_SET,
                     pickle.FROZENSET)
)


def _counted(handler: Any, weight: int) -> Any:
    def run(self: Any) -> None:
        self.units_left -= weight
        if self.units_left < 0:
            raise DumpError(
                f"builds more than {MAX_PICKLE_UNITS} objects' worth of data: larger than any Flight "
                "Recorder dump torch writes (a pickle bomb?)"
            )
        handler(self)

    return run


class _CountingUnpickler(_Refusing, pickle._Unpickler):  # type: ignore[name-defined,misc]
    """The Python unpickler with each opcode's handler wrapped to spend from a budget before it builds."""

    dispatch = {
        key: handler if key in _FREE_OPCODES else _counted(handler, 3 if key in _CONTAINER_OPCODES else 1)
        for key, handler in pickle._Unpickler.dispatch.items()  # type: ignore[attr-defined]
    }

    def __init__(self, file: Any, units: int = MAX_PICKLE_UNITS) -> None:
        super().__init__(file)
        self.units_left = units


def load_plain_pickle(data: bytes) -> Any:
    """Unpickle `data` allowing only plain containers and scalars, and only as much as a real dump
    builds; DumpError otherwise."""
    if len(data) > MAX_DUMP_BYTES:
        raise DumpError(f"{len(data)} bytes: larger than any Flight Recorder dump ({MAX_DUMP_BYTES})")
    unpickler = _PlainUnpickler if len(data) <= FAST_PICKLE_BYTES else _CountingUnpickler
    try:
        return unpickler(io.BytesIO(data)).load()
    except DumpError:
        raise
    except RecursionError:
        raise DumpError("not a Flight Recorder dump: nested too deeply") from None
    except Exception as exc:  # a truncated or garbage pickle raises almost anything
        raise DumpError(f"not a readable pickle: {type(exc).__name__}: {exc}"[:300]) from None


@dataclass(frozen=True)
class Frame:
    filename: str
    line: int
    name: str

    def where(self) -> str:
        return f"{self.filename}:{self.line}"

    @property
    def is_user(self) -> bool:
        """In the user's own code, not in torch, another installed package or the interpreter."""
        return not _is_library_file(self.filename)


@dataclass(frozen=True)
class Entry:
    """One collective (or p2p op) as a rank recorded it."""

    pg: str  # process group id as torch numbers it ("0" is the default group)
    pg_name: str
    seq: int  # collective_seq_id (p2p_seq_id for p2p ops)
    op: str  # all_reduce, broadcast, barrier, send ... (backend prefix removed)
    backend: str  # gloo, nccl, ...
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    state: str
    frames: tuple[Frame, ...] = ()

    def signature(self) -> tuple[Any, ...]:
        """What must be equal on every rank for the collective to match."""
        return (self.op, self.input_sizes, self.input_dtypes)

    def user_frame(self) -> Optional[Frame]:
        """The innermost frame outside torch: the line of the training script that issued it."""
        return next((frame for frame in self.frames if frame.is_user), None)


@dataclass(frozen=True)
class PgStatus:
    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass
class Dump:
    rank: Optional[int]
    source: str  # file name (or "<bytes>")
    version: str
    entries: list[Entry] = field(default_factory=list)
    pg_status: dict[str, PgStatus] = field(default_factory=dict)
    pg_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)  # by pg name, when parsable
    pg_names: dict[str, str] = field(default_factory=dict)  # pg id -> name

    def entries_have_frames(self) -> bool:
        return any(entry.frames for entry in self.entries)


_LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen")


def _is_library_file(filename: str) -> bool:
    return any(part in filename for part in _LIBRARY_PARTS) or filename.startswith("<")


# Seq ids, ranks, sizes: an int, or (the JSON dump writes some as text) a decimal string; -1 when neither.
# parse_int bounds the digits: a 4300-digit integer is no seq id torch wrote, and could not be printed.
_as_int = partial(parse_int, default=-1, signed=True)


def _as_str(value: Any) -> str:
    # Only scalars are turned into text: str() of a container built from shared references (a pickle can
    # nest one list in itself many times over) would take exponential time.
    if isinstance(value, str):
        return value[:1000]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)[:200] if not (isinstance(value, int) and value.bit_length() > 200) else ""
    return ""


def _as_strs(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(d[:50] for d in value[:64] if isinstance(d, str))


def _as_sizes(value: Any, budget: Budget) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    out = []
    for shape in value[:64]:
        if isinstance(shape, (list, tuple)):
            budget.spend(1 + min(len(shape), 16))
            out.append(tuple(_as_int(d) for d in shape[:16]))
    return tuple(out)


def _as_frames(value: Any, budget: Budget) -> tuple[Frame, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    frames: list[Frame] = []
    for raw in value[:MAX_FRAMES_READ]:
        budget.spend()
        if isinstance(raw, dict):
            line = _as_int(raw.get("line"), default=0)
            frame = Frame(_as_str(raw.get("filename")), line, _as_str(raw.get("name")))
            if frame.is_user:
                frames = frames[: MAX_FRAMES_KEPT - 1] + [frame]
                break
            if len(frames) < MAX_FRAMES_KEPT:
                frames.append(frame)
    return tuple(frames)


def _parse_entry(raw: Any, budget: Budget) -> Optional[Entry]:
    budget.spend()
    if not isinstance(raw, dict):
        return None
    name = _as_str(raw.get("profiling_name"))
    backend, _, op = name.partition(":")
    if not op:
        backend, op = "", name
    pg = raw.get("process_group")
    pg_id = _as_str(raw.get("pg_id")) if raw.get("pg_id") is not None else ""
    pg_name = ""
    if isinstance(pg, (list, tuple)) and pg:
        pg_id = pg_id or _as_str(pg[0])
        pg_name = _as_str(pg[1]) if len(pg) > 1 else ""
    is_p2p = bool(raw.get("is_p2p"))
    seq = _as_int(raw.get("p2p_seq_id" if is_p2p else "collective_seq_id"))
    return Entry(
        pg=pg_id,
        pg_name=pg_name,
        seq=seq,
        op=op,
        backend=backend,
        is_p2p=is_p2p,
        input_sizes=_as_sizes(raw.get("input_sizes"), budget),
        input_dtypes=_as_strs(raw.get("input_dtypes")),
        output_sizes=_as_sizes(raw.get("output_sizes"), budget),
        state=_as_str(raw.get("state")),
        frames=_as_frames(raw.get("frames"), budget),
    )


def _parse_ranks(text: Any, budget: Budget) -> tuple[int, ...]:
    if isinstance(text, (list, tuple)):
        budget.spend(min(len(text), 100_000))
        return tuple(_as_int(r) for r in text[:100_000])
    if isinstance(text, str) and len(text) < 1_000_000:
        ranks = tuple(int(m) for m in re.findall(r"\d{1,9}", text))
        budget.spend(len(ranks))
        return ranks
    return ()


def build_dump(
    raw: Any, source: str = "<bytes>", rank: Optional[int] = None, budget: Optional[Budget] = None
) -> Dump:
    """Turn the decoded dump (a dict) into a Dump; DumpError when it is not shaped like one or expands
    past `budget` (objects built: a fresh MAX_BUILT_OBJECTS by default)."""
    budget = budget if budget is not None else Budget()
    if not isinstance(raw, dict) or not isinstance(raw.get("entries", []), (list, tuple)):
        raise DumpError("not a Flight Recorder dump: no `entries` list at the top level")
    if "entries" not in raw and "pg_status" not in raw:
        raise DumpError("not a Flight Recorder dump: neither `entries` nor `pg_status` present")
    entries_raw = raw.get("entries") or []
    if len(entries_raw) > MAX_ENTRIES:
        raise DumpError(f"not a Flight Recorder dump: {len(entries_raw)} entries")
    dump_rank = raw.get("rank")
    dump = Dump(
        rank=dump_rank_number if 0 <= (dump_rank_number := _as_int(dump_rank)) <= MAX_PLAUSIBLE_RANK else rank,
        source=source,
        version=_as_str(raw.get("version")),
    )
    dump.entries = [e for e in (_parse_entry(r, budget) for r in entries_raw) if e is not None]
    status = raw.get("pg_status")
    if isinstance(status, dict):
        for pg, st in list(status.items())[:10_000]:
            budget.spend()
            if isinstance(st, dict):
                dump.pg_status[_as_str(pg)] = PgStatus(
                    _as_int(st.get("last_enqueued_collective")),
                    _as_int(st.get("last_started_collective")),
                    _as_int(st.get("last_completed_collective")),
                )
    config = raw.get("pg_config")
    if isinstance(config, dict):
        for name, conf in list(config.items())[:10_000]:
            if isinstance(conf, dict):
                dump.pg_ranks[_as_str(name)] = _parse_ranks(conf.get("ranks"), budget)
    for entry in dump.entries:
        if entry.pg_name:
            dump.pg_names.setdefault(entry.pg, entry.pg_name)
    return dump


def parse_dump(
    data: bytes, source: str = "<bytes>", rank: Optional[int] = None, budget: Optional[Budget] = None
) -> Dump:
    """Decode a dump in either format (JSON text, or pickle through the restricted unpickler)."""
    head = data[:64].lstrip()
    if head.startswith(b"{"):
        try:
            raw = json.loads(data.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError) as exc:
            raise DumpError(f"not valid JSON: {exc}"[:300]) from None
    elif head.startswith(b"\x80") or head[:1] in (b"(", b"}", b"]"):
        raw = load_plain_pickle(data)
    else:
        raise DumpError("neither JSON nor a pickle (a Flight Recorder dump is one of those)")
    return build_dump(raw, source, rank, budget)


# No job has a million ranks: a larger rank (a dump's own field, or the number ending its name) is
# not believed; the file is then left out with a note rather than aligned as rank 9999999.
MAX_PLAUSIBLE_RANK = 999_999


def rank_from_name(name: str) -> Optional[int]:
    """torch names dumps `<prefix><rank>` (optionally with .json/.pkl): the trailing number is the rank.

    None when there is none, or it is signed (`rank_-1`) or longer than 7 digits (`rank_99999999`): the
    last digits of such a name are not a rank. A 7-digit number past MAX_PLAUSIBLE_RANK is returned
    as is, for the caller to refuse with a note."""
    base = name.rsplit("/", 1)[-1]
    base = re.sub(r"\.(json|pkl|pickle)$", "", base)
    match = re.search(r"(?<![\d-])(\d{1,7})$", base)
    return int(match.group(1)) if match else None


def is_dump_head(head: bytes) -> bool:
    """Whether a file starting with `head` is a dump rather than a log: JSON, a pickle of protocol 2+
    (PROTO opcode), or a dict pickled with protocol 0 (`(dp0`) or 1 (`}q\x00(`)."""
    return (
        head[:1] == b"\x80"
        or head.lstrip()[:1] == b"{"
        or head.startswith(b"(dp")
        or head[:2] in (b"}q", b"}(", b"}r")
    )
