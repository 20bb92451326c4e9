"""Flight Recorder dumps: the restricted loader on real torch 2.13 gloo dumps (pickle and JSON), the
alignment of the three hung-job scenarios, and the gloo pair that crashes torch's own torchfrtrace."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpdoctor.hang.align import align_dumps
from ddpdoctor.hang.fr import DumpError, build_dump, load_plain_pickle, parse_dump, rank_from_name
from ddpdoctor.hang.probe_io import read_dumps, read_source
from ddpdoctor.hang.source import classify_split, enclosing_if
from ddpdoctor.hang.verdict import HangFacts, judge_hang

FIX = Path(__file__).parent / "fixtures" / "flight_recorder"
# The fixtures were recorded from this version of tests/_hang_job.py (their frames name its lines).
JOB = FIX / "hang_job_as_recorded.py.txt"


def _line(tag: str) -> int:
    return next(n for n, t in enumerate(JOB.read_text().splitlines(), 1) if f"HANG-LINE {tag}" in t)


def _dumps(scenario: str, fmt: str):
    paths = sorted(p for p in (FIX / scenario).iterdir() if p.name.endswith(".json") == (fmt == "json"))
    return [parse_dump(p.read_bytes(), str(p), rank_from_name(p.name)) for p in paths]


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_real_dump_is_read(fmt):
    dump = _dumps("sleep", fmt)[0]
    assert dump.rank == 0 and dump.version == "2.10"
    assert [e.seq for e in dump.entries] == [1, 2, 3, 4]
    first = dump.entries[0]
    assert (first.pg, first.pg_name, first.backend, first.op) == ("0", "default_pg", "gloo", "all_reduce")
    assert first.input_sizes == ((16,),) and first.input_dtypes == ("Float",)
    assert dump.pg_status["0"].last_enqueued == 4
    assert dump.pg_ranks == {"": (0, 1, 2)}
    if fmt == "pickle":  # only the pickle carries Python frames
        assert first.user_frame().filename.endswith("_hang_job.py")
    else:
        assert first.frames == ()


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize(
    "scenario,kind,culprits,others,seq",
    [("sleep", "behind", (2,), (0, 1), 4), ("mismatch", "desync", (1,), (0, 2), 4), ("skip", "desync", (0,), (1, 2), 4)],
)
def test_alignment_of_the_three_hangs(fmt, scenario, kind, culprits, others, seq):
    worst = align_dumps(_dumps(scenario, fmt)).worst()
    assert (worst.kind, worst.culprits, worst.others, worst.seq, worst.tie) == (kind, culprits, others, seq, False)


def test_verdicts_name_rank_and_line_from_dumps_alone():
    recorded = JOB.read_text().splitlines()
    for scenario, kind, rank, tag in [("mismatch", "desync", 1, "mismatch"), ("skip", "only_some", 0, "skip")]:
        dumps = _dumps(scenario, "pickle")
        # The frames name the recording checkout's path: give the verdict that file's text as recorded.
        facts = HangFacts(host="h", dumps=dumps, sources={e.user_frame().filename: recorded
                                                          for d in dumps for e in d.entries if e.user_frame()})
        verdict = judge_hang(facts).verdict
        assert verdict["kind"] == kind and verdict["culprit_ranks"] == [rank]
        assert f"_hang_job.py:{_line(tag)}" in verdict["summary"]
    behind = judge_hang(HangFacts(host="h", dumps=_dumps("sleep", "pickle"))).verdict
    assert behind["kind"] == "behind" and behind["culprit_ranks"] == [2]
    assert "rank 2 is behind" in behind["summary"] and "ranks 0-1 wait in all_reduce #4" in behind["summary"]


def test_gloo_pair_that_crashes_torchfrtrace_is_analysed():
    # Real dumps: rank 0 all_reduce vs rank 1 broadcast at seq 2; torchfrtrace raises KeyError ('0', 0).
    reads = read_dumps(str(FIX / "gloo-pair"))
    dumps = [r.dump for r in reads if r.dump is not None]
    assert sorted(d.rank for d in dumps) == [0, 1] and all(d.entries_have_frames() for d in dumps)
    worst = align_dumps(dumps).worst()
    assert worst.kind == "desync" and worst.seq == 2 and worst.tie
    assert {worst.culprit_entry.op, worst.other_entry.op} == {"all_reduce", "broadcast"}
    verdict = judge_hang(HangFacts(host="h", dumps=dumps)).verdict
    assert verdict["kind"] == "desync" and "#2 of the default group" in verdict["summary"]
    assert "rank 1" in verdict["summary"] and "rank 0" in verdict["summary"]


def test_extra_collective_is_found_when_the_rank_went_on():
    # NCCL matches mismatched all_reduces blindly: rank 0's extra all_reduce #4 pairs with the others'
    # #4 and rank 0 then hangs alone in #5. Built from the real skip dump, shifted as NCCL would leave it.
    dumps = _dumps("sleep", "pickle")
    extra = build_dump({"entries": [
        {**e, "collective_seq_id": s} for s, e in
        [(1, _raw(0, 1)), (2, _raw(0, 2)), (3, _raw(0, 3)), (4, {**_raw(0, 4), "input_sizes": [[1]]}), (5, _raw(0, 4))]
    ], "pg_status": {"0": {"last_enqueued_collective": 5}}}, "x", rank=0)
    others = [d for d in dumps if d.rank in (1,)]
    for d in others:
        d.pg_status["0"] = type(d.pg_status["0"])(4, -1, 3)
    worst = align_dumps([extra, *others, _copy_rank(others[0], 2)]).worst()
    assert worst.kind == "extra" and worst.culprits == (0,)


def _raw(rank: int, index: int) -> dict:
    raw = load_plain_pickle((FIX / "sleep" / f"rank_{rank}").read_bytes())
    return raw["entries"][index - 1]


def _copy_rank(dump, rank):
    import copy

    other = copy.deepcopy(dump)
    other.rank = rank
    return other


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/ddpdoctor-pwned",))


def test_restricted_unpickler_refuses_code(tmp_path):
    evil = pickle.dumps({"entries": [], "payload": _Evil()})
    with pytest.raises(DumpError, match=r"refused: the pickle asks for (posix|os)\.system"):
        load_plain_pickle(evil)
    (tmp_path / "rank_0").write_bytes(evil)
    reads = read_dumps(str(tmp_path / "rank_"))
    assert reads[0].dump is None and "refused" in reads[0].error
    assert not Path("/tmp/ddpdoctor-pwned").exists()


@pytest.mark.parametrize("payload", [pickle.dumps(__import__("collections").OrderedDict(a=1)), pickle.dumps(Path("x")), b"cos\nsystem\n(S'true'\ntR."])
def test_restricted_unpickler_refuses_any_class(payload):
    with pytest.raises(DumpError):
        load_plain_pickle(payload)


def test_prefix_directory_and_single_file(tmp_path):
    for name in ("rank_0", "rank_1"):
        (tmp_path / name).write_bytes((FIX / "sleep" / name).read_bytes())
    assert len(read_dumps(str(tmp_path / "rank_"))) == 2
    assert len(read_dumps(str(tmp_path))) == 2
    assert read_dumps(str(tmp_path / "rank_1"))[0].dump.rank == 1


def test_dump_over_the_limit_is_refused_by_size(tmp_path, monkeypatch):
    import ddpdoctor.hang.probe_io as probe_io

    (tmp_path / "rank_0").write_bytes((FIX / "sleep" / "rank_0").read_bytes())
    monkeypatch.setattr(probe_io, "MAX_DUMP_BYTES", 16)
    reads = read_dumps(str(tmp_path / "rank_0"))
    assert reads[0].dump is None and "too large" in reads[0].error


def test_json_and_pickle_of_one_rank_keep_the_pickle():
    reads = read_dumps(str(FIX / "skip"))
    assert len(reads) == 3 and all(r.dump.entries_have_frames() for r in reads)


@pytest.mark.parametrize("job", [JOB, Path(__file__).with_name("_hang_job.py")])
def test_source_classification_of_the_job_file(job):
    lines = job.read_text().splitlines()

    def line(tag: str) -> int:
        return next(n for n, t in enumerate(lines, 1) if f"HANG-LINE {tag}" in t)

    assert classify_split(lines, line("skip"), line("skip") + 1)[0] == "only_some"
    assert classify_split(lines, line("mismatch"), line("mismatch") + 2)[0] == "branches"
    assert classify_split(lines, line("sleep"), line("sleep") + 1)[0] == "only_some"
    branch = enclosing_if(lines, line("skip"))
    assert branch.condition == "if rank == 0:" and branch.rank_dependent
    assert read_source(str(job), [str(job.parent)]) == lines


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_loaders_never_crash_on_bytes(data):
    for blob in (data, b"\x80\x04" + data, b"{" + data):
        try:
            dump = parse_dump(blob)
        except DumpError:
            continue
        align_dumps([dump, dump])


_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4), max_leaves=30)
_entry = st.fixed_dictionaries(
    {},
    optional={
        "collective_seq_id": _values, "pg_id": _values, "process_group": _values, "profiling_name": _values,
        "input_sizes": _values, "input_dtypes": _values, "frames": _values, "is_p2p": _values, "state": _values,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_entry, max_size=6), _values, _values, st.sampled_from(["pickle", "json"]))
def test_loaders_never_crash_on_dump_shapes(entries, status, config, fmt):
    raw = {"entries": entries, "pg_status": status, "pg_config": config, "rank": 0}
    data = pickle.dumps(raw) if fmt == "pickle" else json.dumps(raw, default=str).encode()
    try:
        dump = parse_dump(data)
    except DumpError:
        return
    other = parse_dump(data, rank=1)
    other.rank = 1
    alignment = align_dumps([dump, other])
    judge_hang(HangFacts(host="h", dumps=[dump, other]))
    assert alignment.ranks


def test_two_rank_skip_names_the_rank_inside_the_if():
    # With two ranks the dumps alone are a tie; the source text says which side is conditional.
    dumps = [d for d in _dumps("skip", "pickle") if d.rank in (0, 1)]
    recorded = JOB.read_text().splitlines()
    sources = {e.user_frame().filename: recorded for d in dumps for e in d.entries if e.user_frame()}
    verdict = judge_hang(HangFacts(host="h", dumps=dumps, sources=sources)).verdict
    assert verdict["kind"] == "only_some" and verdict["culprit_ranks"] == [0], verdict["summary"]
    assert f"_hang_job.py:{_line('skip')}" in verdict["summary"] and "inside `if rank == 0:`" in verdict["summary"]
    # Without the source it stays an honest tie.
    tie = judge_hang(HangFacts(host="h", dumps=dumps)).verdict
    assert tie["kind"] == "desync" and tie["tie"]


def test_classification_of_elif_else_chains():
    lines = [
        "def step(rank):",
        "    if rank == 0:",
        "        dist.all_reduce(a)",
        "    elif rank == 1:",
        "        dist.broadcast(a, 0)",
        "    else:",
        "        # comment",
        "        dist.barrier()",
        "    dist.all_gather(b)",
        "    if epoch > 3:",
        "        dist.all_reduce(c)",
        "    dist.barrier()",
    ]
    assert classify_split(lines, 3, 5)[0] == "branches"
    assert classify_split(lines, 8, 3)[0] == "branches"
    assert classify_split(lines, 5, 9)[0] == "only_some"
    assert classify_split(lines, 9, 8)[0] == "only_some_other"
    assert classify_split(lines, 11, 12)[0] == "unknown"  # not a rank test
    assert enclosing_if(lines, 8).condition == "if rank == 0:"


def test_shared_reference_bomb_is_read_quickly():
    # 40 levels of a list holding itself twice: tiny as a pickle, 2**40 leaves as a tree.
    nested: list = ["x"]
    for _ in range(40):
        nested = [nested, nested]
    data = pickle.dumps({"entries": [{"profiling_name": nested, "process_group": nested, "input_sizes": nested,
                                      "frames": nested, "input_dtypes": nested}],
                         "pg_status": {"0": nested}, "pg_config": {"x": {"ranks": nested}}})
    assert len(data) < 2000
    dump = parse_dump(data)
    assert dump.entries[0].op == "" and align_dumps([dump, dump]) is not None
