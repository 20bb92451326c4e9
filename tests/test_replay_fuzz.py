"""Never crash on the machine we diagnose: `check --replay DIR --only gpu,rdma --json` over snapshot
directories whose GPU and RDMA files hold garbage, truncated or spliced real captures, and JSON facts of
the wrong type (lists for dicts, strings for numbers, nulls, NaN), must never report
`core.probe.crashed`, and must exit 0, 1 or 3 with a JSON report.

The text files start from the real captures in tests/fixtures/gpu and tests/fixtures/rdma (provenance in
their README.md); the JSON facts start from realistic documents (NVML readings gathered through the fake
NVML of test_nvml, a sysfs tree as `read_infiniband_sysfs` stores it) and are then damaged at random.
"""

from __future__ import annotations

import json
import math
import random
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_nvml import FakeNvml, h100
from typer.testing import CliRunner

from ddpdoctor.checks.gpu import check_gpu
from ddpdoctor.checks.gpu.collect import GpuCollected
from ddpdoctor.checks.rdma import RdmaFacts, check_rdma
from ddpdoctor.cli import app
from ddpdoctor.core.engine import PROBE_CRASHED
from ddpdoctor.edge import nvml
from ddpdoctor.edge.json_shape import InRange, ListOf, MapOf, Nullable, Record
from ddpdoctor.edge.sysfs_ib import IB_SYSFS_SHAPE
from ddpdoctor.parsers import load_parse_tools

FIXTURES = Path(__file__).parent / "fixtures"
GPU = FIXTURES / "gpu"
RDMA = FIXTURES / "rdma"


def _texts(folder: Path, *patterns: str) -> list[str]:
    return [p.read_text() for pattern in patterns for p in sorted(folder.glob(pattern))]


# Lines written in the documented formats for the tools without a capture in the fixtures (the kernel's
# /proc/modules and lsmod layouts, NVIDIA's Xid line) and the unreadable markers nvidia-smi prints.
MODULES_TEXT = (
    "Module                  Size  Used by\n"
    "nvidia_peermem         16384  0\n"
    "mlx5_ib               483328  0\n"
    "ib_core               450560  2 mlx5_ib,nvidia_peermem\n"
    "mlx5_core            2117632  1 mlx5_ib\n"
    "nvidia              56717312  2 nvidia_peermem\n"
)
PROC_MODULES_TEXT = (
    "nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)\n"
    "mlx5_ib 483328 0 - Live 0x0000000000000000\n"
    "ib_core 450560 2 mlx5_ib,nvidia_peermem, Live 0x0000000000000000\n"
)
XID_TEXT = (
    "[ 1234.5] NVRM: Xid (PCI:0000:19:00): 79, pid=0, GPU has fallen off the bus.\n"
    "[ 1234.6] NVRM: Xid (PCI:0000:3b:00): 63, pid=1234, Row Remapper: New row marked for remapping\n"
    "[ 1234.7] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
    "NVRM: (PCI ID: 10de:2330) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands.\n"
)
TORCH_INFO_TEXT = json.dumps(
    {
        "schema": "ddpdoctor.edge.torch_info/1",
        "torch": {"version": "2.5.1", "cuda": "12.4", "hip": None, "cuda_available": True, "device_count": 2},
        "errors": {},
    }
)

# Command files (ids of ddpdoctor.checks.gpu / rdma / system / torch) and the real texts they start from.
SEEDS: dict[str, list[str]] = {
    "nvidia-smi-q": _texts(GPU, "nvidia-smi-q__*.txt", "nvidia-smi__*.txt"),
    "nvidia-smi-topo-m": _texts(GPU, "nvidia-smi-topo-m__*.txt"),
    "nvidia-smi-topo-p2p": _texts(GPU, "nvidia-smi-topo-p2p*.txt"),
    "nvidia-smi-nvlink-s": _texts(GPU, "nvidia-smi-nvlink-s__*.txt"),
    "nvidia-smi-nvlink-e": _texts(GPU, "nvidia-smi-nvlink-e__*.txt"),
    "dmesg": _texts(GPU, "dmesg*.txt") + [XID_TEXT],
    "ibstat": _texts(RDMA, "ibstat__*.txt"),
    "ibv_devinfo": _texts(RDMA, "ibv_devinfo*.txt"),
    "ibstatus": _texts(RDMA, "ibstatus__*.txt"),
    "lspci-vvv": _texts(RDMA, "lspci*.txt"),
    "lsmod": [MODULES_TEXT],
    "ulimit-a": _texts(RDMA, "ulimit-a__*.txt"),
    "torch-info": [TORCH_INFO_TEXT],
}
ALL_LINES = sorted({line for texts in SEEDS.values() for t in texts for line in t.splitlines()})
# Tokens that replace a value on a line: the markers tools print, numbers too large, malformed or negative.
BAD_TOKENS = [
    "N/A",
    "[N/A]",
    "ERR!",
    "Unknown Error",
    "",
    "-1",
    "0",
    "99999999999999999999999",
    "1.2.3",
    "1e400",
    "nan",
    "x16x",
    "GPU",
    "GPU0",
    "NV",
    "'",
    ":",
    "\t",
    "\u00e9\u0663",
]


@st.composite
def damaged_text(draw: st.DrawFn, seeds: list[str]) -> str:
    """A real capture cut short, with lines dropped, duplicated, borrowed from other tools or mangled."""
    base = draw(st.sampled_from(seeds))
    lines = base.splitlines()
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    rate = draw(st.sampled_from([0.0, 0.05, 0.3]))
    out: list[str] = []
    for line in lines:
        roll = rng.random()
        if roll < rate / 3:
            continue
        if roll < rate * 2 / 3:
            out.append(rng.choice(ALL_LINES))
        elif roll < rate:
            words = line.split(" ")
            words[rng.randrange(len(words))] = rng.choice(BAD_TOKENS)
            out.append(" ".join(words))
        out.append(line)
    text = "\n".join(out)
    cut = draw(st.sampled_from([None, "start", "middle", "random"]))
    if cut == "start":
        text = text[: rng.randrange(max(len(text), 1))]
    elif cut == "middle":
        text = text[len(text) // 2 :]
    elif cut == "random":
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        text = text[:a] + text[b:]
    return text


def command_text(cid: str) -> st.SearchStrategy[Optional[str]]:
    seeds = SEEDS[cid]
    return st.one_of(
        st.none(),  # not in the snapshot
        st.sampled_from(seeds),
        damaged_text(seeds),
        st.lists(st.sampled_from(ALL_LINES), max_size=30).map("\n".join),
        st.text(max_size=200),
    )


GARBAGE: list[Any] = [
    None,
    "",
    "N/A",
    "12",
    "-3",
    "abc",
    -1,
    0,
    2**70,
    1.5,
    math.nan,
    math.inf,
    True,
    [],
    [1, "a", None],
    {},
    {"x": 1},
]


def damage(value: Any, rng: random.Random, rate: float) -> Any:
    """The JSON value with some nodes replaced by values of another type."""
    if rng.random() < rate:
        return rng.choice(GARBAGE)
    if isinstance(value, dict):
        return {k: damage(v, rng, rate) for k, v in value.items()}
    if isinstance(value, list):
        return [damage(v, rng, rate) for v in value]
    return value


def _nvml_doc() -> dict[str, Any]:
    gpus = [h100(0), h100(1, nvmlDeviceGetRemappedRows=(0, 2, 1, 0), nvmlDeviceGetCurrPcieLinkWidth=8)]
    gpus[0]["nvmlDeviceGetComputeRunningProcesses"] = [type("P", (), {"pid": 1, "usedGpuMemory": 2**30})()]
    return nvml.gather_nvml(FakeNvml(gpus))


FACT_SEEDS: dict[str, list[Any]] = {
    "nvml": [
        _nvml_doc(),
        {"available": False, "error": {"kind": "driver_mismatch", "message": "nvmlInit: mismatch"}},
        {"available": True, "device_count": 0, "gpus": [], "driver_version": "550.90.07"},
    ],
    "infiniband-sysfs": [
        {
            "class_dir": "/sys/class/infiniband",
            "class_dir_present": True,
            "devices": [
                {
                    "name": name,
                    "hca_type": "MT4129",
                    "fw_ver": fw,
                    "board_id": "MT_0000000838",
                    "node_type": "1: CA",
                    "numa_node": 0,
                    "pci_slot": "0000:1a:00.0",
                    "ports": [
                        {
                            "port": 1,
                            "state": state,
                            "phys_state": phys,
                            "rate": rate,
                            "link_layer": "InfiniBand",
                        }
                    ],
                }
                for name, fw, state, phys, rate in (
                    ("mlx5_0", "28.39.1002", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)"),
                    ("mlx5_1", "28.37.1014", "1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)"),
                    ("mlx5_2", "28.39.1002", "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)"),
                )
            ],
            "dev_infiniband": ["rdma_cm", "uverbs0", "uverbs1"],
            "gdr_markers": ["sys/module/nvidia_peermem/version"],
        },
        {
            "class_dir": "/sys/class/infiniband",
            "class_dir_present": False,
            "devices": [],
            "dev_infiniband": None,
        },
    ],
    "kernel-modules": [
        {"proc_modules": PROC_MODULES_TEXT, "sys_module": ["ib_core", "mlx5_ib", "nvidia"]},
        {"proc_modules": None, "sys_module": None},
    ],
    "gpu-pci": [[{"bus_id": "0000:19:00.0", "class": "0x030200", "driver": None}], []],
    "env": [
        {
            "CUDA_VISIBLE_DEVICES": "0,1",
            "LOCAL_WORLD_SIZE": "4",
            "NCCL_IB_HCA": "=mlx5_0:1,mlx5_9",
            "NCCL_IB_DISABLE": "0",
            "NCCL_IB_GID_INDEX": "3",
        },
        {"CUDA_VISIBLE_DEVICES": "GPU-ee79,MIG-1", "NCCL_IB_HCA": "^mlx5_1:x", "NCCL_NET": "Socket"},
    ],
}
# Any JSON at all, as a hand-edited snapshot might hold.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def damaged_fact(draw: st.DrawFn, name: str) -> Any:
    base = draw(st.sampled_from(FACT_SEEDS[name]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    return damage(base, rng, draw(st.sampled_from([0.02, 0.1, 0.4])))


def fact_json(name: str) -> st.SearchStrategy[Optional[str]]:
    """The text of DIR/<name>.json: absent, invalid JSON, realistic, damaged, or anything."""
    return st.one_of(
        st.none(),
        st.sampled_from(["", "{", "not json", "[]", "null", "42", '"text"']),
        st.sampled_from(FACT_SEEDS[name]).map(json.dumps),
        damaged_fact(name).map(json.dumps),
        ANY_JSON.map(json.dumps),
    )


WELL_TYPED_META = st.fixed_dictionaries(
    {
        "returncode": st.sampled_from([0, 1, 255, -9, None]),
        "timed_out": st.booleans(),
        "stderr": st.one_of(
            st.just(""),
            st.sampled_from(
                [
                    "dmesg: read kernel buffer failed: Operation not permitted",
                    "ibpanic: [1234] main: stat of IB device 'mlx5_8' failed: No such file or directory",
                    "Failed to get IB devices list: Function not implemented",
                    "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error",
                    "Failed to initialize NVML: Driver/library version mismatch",
                ]
            ),
            st.text(max_size=60),
        ),
    }
)

# Hand-edited meta files: wrong types, wrong shapes, not JSON at all.
META = st.one_of(
    WELL_TYPED_META,
    st.fixed_dictionaries(
        {
            "returncode": st.one_of(st.none(), st.text(max_size=5), st.floats(), st.booleans()),
            "timed_out": st.one_of(st.none(), st.text(max_size=5), st.integers()),
            "stderr": st.one_of(st.none(), st.integers(), st.lists(st.integers(), max_size=3)),
        }
    ),
    ANY_JSON,
)


def write_snapshot(directory: Path, files: dict[str, Optional[str]], metas: dict[str, Any]) -> None:
    for name, text in files.items():
        if text is not None:
            (directory / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    for cid, meta in metas.items():
        (directory / f"{cid}.meta.json").write_text(json.dumps(meta))


def check_replay(directory: Path) -> dict[str, Any]:
    """Run the CLI on the snapshot and assert the never-crash contract; the JSON report."""
    result = CliRunner().invoke(app, ["check", "--replay", str(directory), "--only", "gpu,rdma", "--json"])
    if not any(p.suffix in (".txt", ".json") for p in directory.iterdir()):
        # A directory with no snapshot file checks nothing: a usage error, never a pass (#20 item 9).
        assert result.exit_code == 2, (result.exit_code, result.output[-2000:])
        assert "holds no snapshot files" in result.output
        return {}
    assert result.exit_code in (0, 1, 3), (result.exit_code, result.output[-2000:], result.exception)
    report = json.loads(result.stdout)
    crashed = [f for f in report["findings"] if f["id"] == PROBE_CRASHED.id]
    assert not crashed, crashed[0]["evidence"][0]["excerpt"] + "\n" + crashed[0]["summary"]
    assert set(report["areas"]) == {"gpu", "rdma"}
    return report


FUZZ_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@FUZZ_SETTINGS
@given(
    texts=st.fixed_dictionaries({f"{cid}.txt": command_text(cid) for cid in SEEDS}),
    facts=st.fixed_dictionaries({f"{name}.json": fact_json(name) for name in FACT_SEEDS}),
    metas=st.dictionaries(st.sampled_from(sorted(SEEDS)), META, max_size=3),
)
def test_replay_of_damaged_snapshot_never_crashes(
    texts: dict[str, Optional[str]], facts: dict[str, Optional[str]], metas: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_snapshot(Path(tmp), {**texts, **facts}, metas)
        check_replay(Path(tmp))


@FUZZ_SETTINGS
@given(
    name=st.sampled_from(sorted(FACT_SEEDS)),
    fact=st.data(),
    rdma_text=st.sampled_from([None, *SEEDS["ibstat"]]),
)
def test_replay_of_one_damaged_fact_never_crashes(
    name: str, fact: st.DataObject, rdma_text: Optional[str]
) -> None:
    """One wrong-typed fact next to otherwise sound files: the damage reaches the judges (the first test
    mostly stops at an unreadable file earlier)."""
    value = fact.draw(damaged_fact(name))
    files: dict[str, Optional[str]] = {
        "nvidia-smi-q.txt": SEEDS["nvidia-smi-q"][0],
        "nvidia-smi-topo-m.txt": SEEDS["nvidia-smi-topo-m"][0],
        "ibstat.txt": rdma_text,
        "lspci-vvv.txt": SEEDS["lspci-vvv"][0],
        "ulimit-a.txt": SEEDS["ulimit-a"][0],
        f"{name}.json": json.dumps(value),
    }
    with tempfile.TemporaryDirectory() as tmp:
        write_snapshot(Path(tmp), files, {})
        check_replay(Path(tmp))


def test_every_real_capture_replays_without_crash(tmp_path: Path) -> None:
    """Each real capture, whole, as the only file of its kind: the baseline the fuzzing damages."""
    for cid, seeds in SEEDS.items():
        for i, text in enumerate(seeds):
            d = tmp_path / f"{cid}-{i}"
            d.mkdir()
            write_snapshot(d, {f"{cid}.txt": text}, {})
            check_replay(d)
    for name, seeds in FACT_SEEDS.items():
        for i, value in enumerate(seeds):
            d = tmp_path / f"{name}-{i}"
            d.mkdir()
            write_snapshot(d, {f"{name}.json": json.dumps(value)}, {})
            check_replay(d)


def test_absurdly_long_numbers_are_garbage_not_crashes(tmp_path: Path) -> None:
    """int() refuses strings of more than 4300 digits: every number in every capture blown up to 5000
    digits must leave the parsers and the checks standing."""
    tools = load_parse_tools()
    for cid, seeds in SEEDS.items():
        for i, text in enumerate(seeds):
            huge = re.sub(r"\d+", "9" * 5000, text)
            for parse in tools.values():
                parse(huge)
            d = tmp_path / f"{cid}-{i}"
            d.mkdir()
            write_snapshot(d, {f"{cid}.txt": huge}, {})
            check_replay(d)


def from_shape(shape: Any) -> st.SearchStrategy[Any]:
    """Any value a fact loader can hand to the judges: the declared types, any values, nulls anywhere."""
    if isinstance(shape, Record):
        return st.fixed_dictionaries({k: from_shape(v) for k, v in shape.fields.items()})
    if isinstance(shape, Nullable):
        return st.none() | from_shape(shape.shape)
    if isinstance(shape, ListOf):
        return st.none() | st.lists(from_shape(shape.item), max_size=3)
    if isinstance(shape, MapOf):
        return st.none() | st.dictionaries(
            st.sampled_from(["0", "1", "12", "idle", "x"]), from_shape(shape.value), max_size=3
        )
    if isinstance(shape, InRange):
        return st.none() | st.integers(shape.low, shape.high)
    scalars = {
        int: st.integers(-(2**40), 2**40),
        float: st.floats(allow_nan=False, allow_infinity=False, width=32),
        bool: st.booleans(),
        str: st.sampled_from(
            ["", "Completed", "In Progress", "Default", "Exclusive_Process", "00000000:19:00.0"]
        )
        | st.text(max_size=8),
    }
    return st.none() | scalars[shape]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(from_shape(nvml.GPU_SHAPE), min_size=1, max_size=3), from_shape(nvml.P2P_SHAPE))
def test_gpu_judges_take_any_value_the_loader_lets_through(gpus: list[dict[str, Any]], p2p: Any) -> None:
    """The judges' half of the contract: whatever types the loader guarantees, any values (negative,
    zero, odd strings, nulls) judge without an exception."""
    fact = nvml.load_nvml_fact({"available": True, "gpus": gpus, "p2p": p2p, "driver_version": "550.90.07"})
    assert fact is not None
    c = GpuCollected(source="nvml", nvml=fact, gpus=fact["gpus"], p2p=fact["p2p"], replay=True)
    for finding in check_gpu(c):
        assert finding.id.startswith("gpu.") and finding.summary


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(from_shape(IB_SYSFS_SHAPE), st.sampled_from([None, *SEEDS["ibstat"]]))
def test_rdma_judges_take_any_value_the_loader_lets_through(sysfs: Any, ibstat: Optional[str]) -> None:
    from ddpdoctor.edge.runner import CommandResult

    result = CommandResult(argv=("ibstat",), returncode=0, stdout=ibstat) if ibstat is not None else None
    for finding in check_rdma(RdmaFacts(sysfs=sysfs, ibstat=result)):
        assert finding.id.startswith("rdma.") and finding.summary
