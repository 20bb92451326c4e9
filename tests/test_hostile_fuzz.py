"""Property tests for hostile inputs (#20), one per input kind, bounded so that CI stays fast:

- every documented snapshot fact file (`all_facts()`), holding random JSON of every type and depth;
- random bytes for every file argument (`parse`, `check --expect`, `bench-nccl --baseline`, `lint`,
  `--replay` text and JSON files).

Never a traceback, never `core.probe.crashed`, never an exit code outside 0-3. The special files (FIFO,
/dev/zero, links, unreadable) for every file argument are in test_hostile_inputs.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.checks import load_areas
from ddpdoctor.cli import app
from ddpdoctor.core.engine import PROBE_CRASHED, run_checks, select_areas
from ddpdoctor.dev.docgen import load_declarations
from ddpdoctor.edge.sources import ReplaySources, all_facts

HEALTHY = Path(__file__).parent / "fixtures" / "ci" / "healthy-cpu-node"
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

load_declarations()
FACT_NAMES = sorted(all_facts())

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**30, max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["", "vm", "N/A", "[Not Supported]", "0x1", "-1", "abc"]),
)
ANY_JSON = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=25,
)


@st.composite
def fact_text(draw: st.DrawFn) -> str:
    """Random JSON of any type, realistic keys at random depth, or nesting from shallow to absurd."""
    kind = draw(st.sampled_from(["any", "keyed", "deep", "raw"]))
    if kind == "any":
        return json.dumps(draw(ANY_JSON))
    if kind == "keyed":  # the keys producers write, with values of any type
        keys = ["interfaces", "holder", "files", "unreadable", "port", "vm", "addresses", "error", "gpus",
                "devices", "container", "kinds", "cmdline", "mtu", "up", "name", "proc_modules"]  # fmt: skip
        return json.dumps(draw(st.dictionaries(st.sampled_from(keys), ANY_JSON, max_size=5)))
    if kind == "deep":
        n = draw(st.integers(min_value=1, max_value=3000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        return opener * n + ("1" if opener != "[" else "") + closer * n
    return draw(st.binary(max_size=200)).decode("latin-1")


def replay_in_process(directory: Path) -> None:
    sources = ReplaySources(directory)
    report = run_checks(sources, select_areas(load_areas(), skip=["nccl"]), timeout_s=30)
    crashed = [f for f in report.findings if f.id == PROBE_CRASHED.id]
    assert not crashed, crashed[0].summary + "\n" + crashed[0].evidence[0].excerpt
    assert int(report.exit_code()) in (0, 1, 3)


@SETTINGS
@given(
    name=st.sampled_from(FACT_NAMES), text=fact_text(), also=st.sampled_from(FACT_NAMES), other=fact_text()
)
def test_any_json_in_any_fact_file_never_crashes(name: str, text: str, also: str, other: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "snap"
        shutil.copytree(HEALTHY, d)
        # MASTER_PORT set, so that the port-holder fact is read too.
        (d / "env.json").write_text(json.dumps({"MASTER_PORT": "29500", "MASTER_ADDR": "127.0.0.1"}))
        (d / f"{also}.json").write_text(other)
        (d / f"{name}.json").write_text(text)
        replay_in_process(d)


FILE_ARGS = [
    ("parse", "df", "{}"),
    ("parse", "nvidia-smi-q", "{}"),
    ("check", "--replay", str(HEALTHY), "--only", "system", "--expect", "{}"),
    ("bench-nccl", "--backend", "gloo", "--baseline", "{}"),
    ("lint", "{}"),
]


@SETTINGS
@given(args=st.sampled_from(FILE_ARGS), data=st.binary(max_size=3000))
def test_random_bytes_in_any_file_argument(args: tuple[str, ...], data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("input.py" if args[0] == "lint" else "input")
        path.write_bytes(data)
        res = CliRunner().invoke(app, [a.replace("{}", str(path)) for a in args])
        assert res.exit_code in (0, 1, 2, 3), (res.exit_code, res.output[-500:])
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


@SETTINGS
@given(name=st.sampled_from(["ulimit-a.txt", "df-shm.txt", "torch-info.txt", "ibstat.txt", "nvidia-smi-q.txt",
                             "ulimit-a.meta.json", "torch-info.meta.json"]),
       data=st.binary(max_size=3000))  # fmt: skip
def test_random_bytes_in_snapshot_command_files(name: str, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "snap"
        shutil.copytree(HEALTHY, d)
        (d / name).write_bytes(data)
        replay_in_process(d)
