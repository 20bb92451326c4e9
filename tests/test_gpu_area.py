"""The gpu area end to end: replay from real nvidia-smi outputs, a fake NVML and fake command source at
the I/O boundary, the torch<->driver verdict, the kernel log, and a clean skip on this CPU-only machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_nvml import R550_FIELDS, FakeNvml, Raise, consumer_gpu, field_values, h100, healthy
from typer.testing import CliRunner

from ddpdoctor.checks import gpu as gpu_area
from ddpdoctor.checks.gpu import collect as gpu_collect
from ddpdoctor.cli import app
from ddpdoctor.core.engine import run_checks
from ddpdoctor.core.model import Finding, Report, Severity
from ddpdoctor.edge import nvml
from ddpdoctor.edge.runner import Command, CommandResult
from ddpdoctor.edge.sources import LiveSources, NotAvailable, RecordingSources, ReplaySources
from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_q
from ddpdoctor.render.gpu import topology_table, topology_text

GPU = Path(__file__).parent / "fixtures" / "gpu"
A100_REMAP = "nvidia-smi-q__a100-sxm4-80gb-xid63-dram-correctable-remap-pending-excerpt.txt"
H100_BRAKE = "nvidia-smi-q__8xh100-535.161.08-gpu0-section-hw-power-brake-active-pcie-replays.txt"
H800 = "nvidia-smi-q__h800-hopper-single-gpu-remapped-rows-ecc-disabled.txt"
# Lines of the real samples, shuffled by the property test below.
SMI_LINES = sorted(
    {line for p in GPU.glob("nvidia-smi-q__*.txt") for line in p.read_text().splitlines()}
    | {
        "        Pending                           : Yes",
        "        Current                   : 4x",
        "GPU 00000000:19:00.0",
    }
    | {
        "[ 1.0] NVRM: Xid (PCI:0000:19:00): 79, pid=0, GPU has fallen off the bus.",
        "NVRM: fallen off the bus",
    }
)


class FakeSources:
    """Commands answered from real captured outputs; facts produced live unless given."""

    def __init__(
        self,
        outputs: Optional[Mapping[str, Any]] = None,
        facts: Optional[Mapping[str, Any]] = None,
        env: Optional[Mapping[str, str]] = None,
        live: bool = True,
    ) -> None:
        self.outputs = dict(outputs or {})
        self.facts = dict(facts or {})
        self.facts.setdefault("env", dict(env or {}))
        self.facts.setdefault("host", "node1")
        self.facts.setdefault("gpu-pci", [])
        self.deadline = 0.0
        self.ran: list[str] = []
        self._live = live

    @property
    def is_live(self) -> bool:
        return self._live

    def run(self, cmd: Command) -> CommandResult:
        self.ran.append(cmd.id)
        out = self.outputs.get(cmd.id)
        if out is None:
            return CommandResult(argv=cmd.argv, found=False, error=f"{cmd.argv[0]}: command not found")
        if isinstance(out, CommandResult):
            return out
        return CommandResult(argv=cmd.argv, returncode=0, stdout=out)

    def fact(self, name: str, produce: Callable[[], Any]) -> Any:
        if name in self.facts:
            value = self.facts[name]
            if isinstance(value, Exception):
                raise value
            return value
        return produce()


def run_gpu(sources: Any, timeout: float = 20.0) -> Report:
    return run_checks(sources, [gpu_area.AREA], timeout_s=timeout)


def by_id(report: Report) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in report.findings:
        out.setdefault(f.id, []).append(f)
    return out


def worst(report: Report, fid: str) -> Severity:
    return max(f.severity for f in by_id(report)[fid])


def torch_info(cuda: Optional[str], count: int = 8, warning: str = "") -> str:
    errors = {"cuda_available.warning": warning} if warning else {}
    return json.dumps(
        {
            "schema": "ddpdoctor.edge.torch_info/1",
            "torch": {
                "version": "2.5.1",
                "cuda": cuda,
                "hip": None,
                "cuda_available": count > 0,
                "device_count": count,
            },
            "errors": errors,
        }
    )


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """Install a FakeNvml as the pynvml module ddpdoctor.edge.nvml loads."""

    def install(gpus: list[dict[str, Any]], **kw: Any) -> FakeNvml:
        fake = FakeNvml(gpus, **kw)
        monkeypatch.setattr(nvml, "_load_bindings", lambda: fake)
        return fake

    return install


def replay_dir(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for name, fixture in files.items():
        shutil.copy(GPU / fixture, tmp_path / name)
    return tmp_path


# --- this machine: no GPU, no driver -----------------------------------------------------------------


@pytest.mark.nogpu
def test_cpu_only_machine_is_a_clean_skip() -> None:
    report = run_gpu(LiveSources())
    (f,) = report.findings
    assert f.id == "gpu.driver" and f.severity == Severity.SKIP
    assert "GPU checks skipped" in f.summary and f.evidence
    assert report.exit_code() == 0


@pytest.mark.nogpu
def test_cpu_only_machine_cli_json() -> None:
    res = CliRunner().invoke(app, ["check", "--only", "gpu", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert [(f["id"], f["severity"]) for f in data["findings"]] == [("gpu.driver", "skip")]


# --- replay from DIR/nvidia-smi-q.txt alone ------------------------------------------------------------


A100_SECTION = "nvidia-smi-q-section__a100-xid63-ecc-retired-remapped-no-gpu-header-excerpt.txt"


def test_excerpt_from_inside_a_gpu_section_is_one_unnamed_gpu(tmp_path: Path) -> None:
    # What bug reports paste: ECC, retired pages and remapped rows, without the `GPU 0000:...` line.
    parsed = parse_nvidia_smi_q((GPU / A100_SECTION).read_text())
    (gpu,) = parsed["gpus"]
    assert gpu["bus_id"] is None and gpu["ecc"]["volatile"]["dram_correctable"] == 177
    assert gpu["remapped_rows"]["pending"] is True
    res = CliRunner().invoke(app, ["parse", "nvidia-smi-q", str(GPU / A100_SECTION)])
    assert res.exit_code == 0, res.output
    # Judged as the GPU it is: the pending remap fails, the correctable count warns.
    ids = by_id(run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": A100_SECTION}))))
    assert worst_of(ids["gpu.remapped_rows.pending"]) == Severity.FAIL
    assert worst_of(ids["gpu.ecc.correctable"]) == Severity.WARN
    # The top of `nvidia-smi -q` alone (no GPU section at all) is still no GPU.
    assert parse_nvidia_smi_q("Timestamp : x\nDriver Version : 550.90.07\n")["gpus"] == []


def test_replay_remap_pending_and_ecc_from_real_a100_sample(tmp_path: Path) -> None:
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": A100_REMAP})))
    ids = by_id(report)
    (remap,) = ids["gpu.remapped_rows.pending"]
    assert remap.severity == Severity.FAIL and "GPU 0 (00000000:10:1C.0)" in remap.summary
    assert (
        remap.evidence[0].source == "nvidia-smi -q (Remapped Rows)"
        and "Pending True" in remap.evidence[0].excerpt
    )
    (ecc,) = ids["gpu.ecc.correctable"]
    assert ecc.severity == Severity.WARN and "177" in ecc.summary
    assert worst(report, "gpu.ecc.uncorrectable") == Severity.OK
    assert (
        "A100-SXM4-80GB" in ids["gpu.inventory"][0].summary and "CUDA 11.6" in ids["gpu.inventory"][0].summary
    )
    assert report.exit_code() == 1


def test_replay_power_brake_and_pcie_replays_from_real_h100_sample(tmp_path: Path) -> None:
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": H100_BRAKE})))
    ids = by_id(report)
    (thr,) = ids["gpu.throttle"]
    assert thr.severity == Severity.FAIL and "hw power brake slowdown" in thr.summary
    (rep,) = ids["gpu.pcie.replays"]
    assert rep.severity == Severity.WARN and "67 PCIe replays" in rep.summary
    assert worst(report, "gpu.pcie.width") == Severity.OK
    assert (
        worst(report, "gpu.fabric") == Severity.OK
        and worst(report, "gpu.remapped_rows.pending") == Severity.OK
    )


L4_X8 = "nvidia-smi-q__l4-550.90.07-x8-of-x16-link-gen1-idle.txt"
GH200 = "nvidia-smi-q__gh200-550.127.05-module-power-capped-aggregate-dram-uncorrectable.txt"
LAPTOP_R580 = "nvidia-smi-q__rtx3050-laptop-580.119.02-51-char-key-column-no-reset-status-process.txt"


def test_replay_degraded_link_width(tmp_path: Path) -> None:
    # The real L4 sample: Link Width Max 16x, Current 8x. Offline, with nothing known about the slot, a
    # narrower link than the GPU's is a failure.
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": L4_X8})))
    (width,) = by_id(report)["gpu.pcie.width"]
    assert width.severity == Severity.FAIL and "x8, below its x16 maximum" in width.summary
    assert width.data["current"] == 8 and width.data["max"] == 16 and width.data["slot_max"] is None
    assert report.exit_code() == 1


@pytest.mark.parametrize(
    ("slot_width", "severity", "words"),
    [(8, Severity.WARN, "the slot (port 0000:00:01.0) is x8"), (16, Severity.FAIL, "(the slot allows x16)")],
)
def test_replay_link_width_judged_against_the_slot(
    tmp_path: Path, slot_width: int, severity: Severity, words: str
) -> None:
    # A snapshot also records the port above each GPU (the `gpu-pci` fact): a x8 slot explains the x8 link.
    pci = [
        {
            "bus_id": "0000:01:00.0",
            "class": "0x030200",
            "driver": "nvidia",
            "width_max": 16,
            "width_current": 8,
            "upstream_bus_id": "0000:00:01.0",
            "upstream_width_max": slot_width,
        }
    ]
    replay_dir(tmp_path, {"nvidia-smi-q.txt": L4_X8})
    (tmp_path / "gpu-pci.json").write_text(json.dumps(pci))
    (width,) = by_id(run_gpu(ReplaySources(tmp_path)))["gpu.pcie.width"]
    assert width.severity == severity and words in width.summary
    assert "slot 0000:00:01.0 x" in width.evidence[0].excerpt


def test_read_nvidia_pci_links_each_gpu_to_its_upstream_port(tmp_path: Path) -> None:
    # The sysfs layout: devices nest under their upstream port; /sys/bus/pci/devices holds links to them.
    tree = tmp_path / "devices" / "pci0000:00"
    port = tree / "0000:00:01.0"
    gpu = port / "0000:01:00.0"
    nic = port / "0000:01:00.1"
    for d, vendor, klass in (
        (port, "0x8086", "0x060400"),
        (gpu, "0x10de", "0x030200"),
        (nic, "0x15b3", "0x020700"),
    ):
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    (port / "max_link_width").write_text("8\n")
    (gpu / "max_link_width").write_text("16\n")
    (gpu / "current_link_width").write_text("8\n")
    bus = tmp_path / "bus"
    bus.mkdir()
    for d in (port, gpu, nic):
        (bus / d.name).symlink_to(d)
    (gpu_entry,) = gpu_collect.read_nvidia_pci(str(bus))
    assert gpu_entry == {
        "bus_id": "0000:01:00.0",
        "class": "0x030200",
        "driver": None,
        "width_max": 16,
        "width_current": 8,
        "upstream_bus_id": "0000:00:01.0",
        "upstream_width_max": 8,
    }


def test_replay_gh200_module_power_sharing_is_info(tmp_path: Path) -> None:
    # Real GH200: Current Power Limit 700 W, Requested and Default 900 W, Module limit 1000 W.
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": GH200})))
    (power,) = by_id(report)["gpu.power_limit"]
    assert power.severity == Severity.INFO and "shared with the CPU" in power.summary
    assert "requested_limit_w=900.0" in power.evidence[0].excerpt


def test_power_limit_enforced_below_requested_without_a_module_warns() -> None:
    from ddpdoctor.checks.gpu.health import judge_power_limit

    capped = {"power": {"limit_w": 500.0, "default_limit_w": 700.0, "requested_limit_w": 700.0}}
    verdict = judge_power_limit(capped)
    assert verdict is not None and verdict.severity == Severity.WARN
    assert "platform enforces 500 W though 700 W is requested" in verdict.text and "BMC" in (
        verdict.fix or ""
    )
    lowered = judge_power_limit(
        {"power": {"limit_w": 500.0, "default_limit_w": 700.0, "requested_limit_w": 500.0}}
    )
    assert (
        lowered is not None
        and lowered.severity == Severity.WARN
        and "nvidia-smi -pl 700" in (lowered.fix or "")
    )


def test_replay_display_processes_only_are_info(tmp_path: Path) -> None:
    # Real R580 laptop: one `G` process (gnome-shell) holding memory: a desktop, not a stray job.
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": LAPTOP_R580})))
    (procs,) = by_id(report)["gpu.processes"]
    assert procs.severity == Severity.INFO and "display process(es)" in procs.summary
    assert "gnome-shell" in procs.summary


def test_replay_xid_45_takes_the_severity_of_its_cause(tmp_path: Path) -> None:
    # Real journal lines: Xid 45 "caused by previous Xid 149/145" (NVLink errors) on several GPUs, with
    # the original Xid 149/145 lines no longer in the log.
    replay_dir(
        tmp_path,
        {
            "nvidia-smi-q.txt": H800,
            "dmesg.txt": "dmesg-journal__8gpu-xid-45-caused-by-previous-xid-149-145-excerpt.txt",
        },
    )
    xids = by_id(run_gpu(ReplaySources(tmp_path)))["gpu.xid"]
    assert xids and all(f.data["code"] == 45 for f in xids)
    from ddpdoctor.parsers.dmesg import XID_TABLE

    by_bus = {f.data["bus_id"]: f for f in xids}
    for bus, cause in (("0000:dc:00", 149), ("0000:ed:00", 145)):
        assert by_bus[bus].severity == Severity.parse(XID_TABLE[cause].severity) > Severity.INFO, bus
        assert f"caused by Xid {cause}" in by_bus[bus].summary
    assert all("caused by Xid 14" in f.summary for f in xids)


def test_xid_154_back_to_none_is_info() -> None:
    from ddpdoctor.checks.gpu.kernel_log import judge_xid_events

    reset = {"code": 154, "recovery_action": "reset"}
    recovered = {"code": 154, "recovery_action": "none"}
    assert judge_xid_events(154, [reset])[0] == Severity.FAIL
    assert judge_xid_events(154, [reset, recovered]) == (
        Severity.INFO,
        " (latest: recovery action back to none)",
    )
    assert judge_xid_events(45, [{"code": 45, "caused_by": None}])[0] == Severity.INFO


def test_replay_healthy_h800_sample(tmp_path: Path) -> None:
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": H800})))
    ids = by_id(report)
    assert not [f for f in report.findings if f.severity >= Severity.WARN and f.id != "gpu.dmesg"]
    (mode,) = ids["gpu.ecc.mode"]
    assert mode.severity == Severity.INFO and "disabled" in mode.summary
    # Idle (Idle reason active) at gen 5: the generation check stays quiet.
    assert worst(report, "gpu.pcie.gen") == Severity.OK and worst(report, "gpu.throttle") == Severity.OK
    # No dmesg.txt in the directory: a skip saying so, never a pass.
    assert (
        ids["gpu.dmesg"][0].severity == Severity.SKIP
        and "dmesg.txt not in snapshot" in ids["gpu.dmesg"][0].summary
    )


@pytest.mark.parametrize(
    "fixture",
    [
        "nvidia-smi-q__v100-sxm2-old-driver-narrow-key-column-excerpt.txt",
        "nvidia-smi-q__gtx1080-driver-396-no-cuda-version-line-excerpt.txt",
    ],
)
def test_replay_old_drivers_never_error(tmp_path: Path, fixture: str) -> None:
    report = run_gpu(ReplaySources(replay_dir(tmp_path, {"nvidia-smi-q.txt": fixture})))
    assert not [f for f in report.findings if f.severity in (Severity.ERROR, Severity.FAIL)]
    assert "gpu.inventory" in by_id(report)


def test_replay_driver_library_mismatch(tmp_path: Path) -> None:
    report = run_gpu(
        ReplaySources(
            replay_dir(tmp_path, {"nvidia-smi-q.txt": "nvidia-smi__nvml-driver-library-version-mismatch.txt"})
        )
    )
    (f,) = [f for f in report.findings if f.id == "gpu.nvml"]
    assert f.severity == Severity.FAIL and "mismatch" in f.summary and "Reboot" in f.fix


def test_replay_unable_to_determine_device_handle(tmp_path: Path) -> None:
    report = run_gpu(
        ReplaySources(
            replay_dir(
                tmp_path,
                {"nvidia-smi-q.txt": "nvidia-smi__unable-to-determine-device-handle-unknown-error.txt"},
            )
        )
    )
    (f,) = [f for f in report.findings if f.id == "gpu.lost"]
    assert f.severity == Severity.FAIL and "0000:0B:00.0" in f.summary
    assert "sudo nvidia-smi -r -i 0000:0B:00.0" in f.fix  # nvidia-smi -i takes the bus id


def test_replay_empty_snapshot_skips(tmp_path: Path) -> None:
    findings = run_gpu(ReplaySources(tmp_path)).findings
    # Nothing at all was read: the engine adds that the replay checked nothing (#20 item 9).
    assert [g.id for g in findings if g.area == "core"] == ["core.snapshot.empty"]
    (f,) = [g for g in findings if g.area != "core"]
    assert (
        f.id == "gpu.driver"
        and f.severity == Severity.SKIP
        and "neither nvml.json nor nvidia-smi-q.txt" in f.summary
    )


def test_replay_topology_nvlink_p2p_dmesg(tmp_path: Path) -> None:
    d = replay_dir(
        tmp_path,
        {
            "nvidia-smi-q.txt": H800,
            "nvidia-smi-topo-m.txt": "nvidia-smi-topo-m__8xh800-nv8-4nic-truncated-legend.txt",
            "nvidia-smi-nvlink-s.txt": "nvidia-smi-nvlink-s__8xh800-all-links-26GBps-elided.txt",
            "nvidia-smi-nvlink-e.txt": "nvidia-smi-nvlink-e__h100-error-counters-zero-elided.txt",
            "dmesg.txt": "dmesg-pcie__h100-bandwidth-limited-by-gen4-x16-link.txt",
        },
    )
    report = run_gpu(ReplaySources(d))
    ids = by_id(report)
    (topo,) = ids["gpu.topology"]
    assert topo.severity == Severity.INFO and "28 NV" in topo.summary
    assert "GPU0" in topo.evidence[0].excerpt and "NV8" in topo.evidence[0].excerpt
    assert "Legend" not in topo.evidence[0].excerpt and "G0" not in topo.evidence[0].excerpt
    (nic,) = ids["gpu.nic_affinity"]
    assert "GPU1->mlx5_0 (PIX)" in nic.summary
    assert worst(report, "gpu.nvlink.inactive") == Severity.OK
    # dmesg lines are for 04:00.0 and 8b:00.0, not this GPU (18:00.0): not reported by the GPU area.
    assert "gpu.pcie.limited" not in ids
    assert worst(report, "gpu.xid") == Severity.OK


# --- fake NVML + fake commands (the live path) --------------------------------------------------------


def test_healthy_8x_h100_node(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(healthy())
    topo = (GPU / "nvidia-smi-topo-m__8xh800-nv8-4nic-truncated-legend.txt").read_text()
    sources = FakeSources(
        outputs={
            "nvidia-smi-topo-m": topo,
            "dmesg": "[0.0] Linux version 6.8\n",
            "torch-info": torch_info("12.4"),
        }
    )
    report = run_gpu(sources)
    bad = [f for f in report.findings if f.severity >= Severity.WARN]
    assert not bad, [(f.id, f.summary) for f in bad]
    ids = by_id(report)
    assert "8x NVIDIA H100 80GB HBM3" in ids["gpu.inventory"][0].summary
    assert ids["gpu.cuda_compat"][0].severity == Severity.OK
    assert ids["gpu.torch_count"][0].severity == Severity.OK
    assert ids["gpu.p2p"][0].severity == Severity.OK and ids["gpu.nvlink.errors"][0].severity == Severity.OK
    # NVML answered: nvidia-smi -q and the nvlink/p2p fallbacks were not run.
    assert "nvidia-smi-q" not in sources.ran and "nvidia-smi-nvlink-s" not in sources.ran
    assert report.exit_code() == 0


def test_lost_gpu_fails_and_others_are_judged(fake_nvml: Callable[..., FakeNvml]) -> None:
    gpus = healthy()
    gpus[2] = h100(2, nvmlDeviceGetRemappedRows=Raise(pynvml.NVML_ERROR_GPU_IS_LOST))
    gpus[6] = h100(6, nvmlDeviceGetCurrPcieLinkWidth=4)
    fake_nvml(gpus)
    report = run_gpu(FakeSources())
    ids = by_id(report)
    (lost,) = ids["gpu.lost"]
    assert lost.severity == Severity.FAIL and lost.summary.startswith("GPU 2 (00000000:4C:00.0)")
    (width,) = [f for f in ids["gpu.pcie.width"] if f.severity == Severity.FAIL]
    assert "GPU 6" in width.summary and "x4" in width.summary


def test_ecc_and_remap_pending_via_nvml(fake_nvml: Callable[..., FakeNvml]) -> None:
    def ecc(handle: Any, err_type: int, counter: int) -> int:
        return 2 if err_type == 1 else 0

    fake_nvml([h100(0), h100(1, nvmlDeviceGetTotalEccErrors=ecc, nvmlDeviceGetRemappedRows=(0, 1, 1, 0))])
    ids = by_id(run_gpu(FakeSources()))
    (unc,) = [f for f in ids["gpu.ecc.uncorrectable"] if f.severity > Severity.OK]
    assert (
        unc.severity == Severity.FAIL and "GPU 1" in unc.summary and unc.evidence[0].source.startswith("NVML")
    )
    (remap,) = [f for f in ids["gpu.remapped_rows.pending"] if f.severity > Severity.OK]
    assert remap.severity == Severity.FAIL


@pytest.mark.parametrize(
    ("action", "severity", "words"),
    [
        (1, Severity.FAIL, "needs a reset"),
        (2, Severity.FAIL, "needs a reboot"),
        (3, Severity.FAIL, "peer-to-peer"),
        (4, Severity.WARN, "draining and resetting"),
        (42, Severity.WARN, "action_42"),
    ],
)
def test_recovery_action_via_nvml(
    fake_nvml: Callable[..., FakeNvml], action: int, severity: Severity, words: str
) -> None:
    r570 = field_values({**R550_FIELDS, nvml.FI_GPU_RECOVERY_ACTION: 0})
    asking = field_values({**R550_FIELDS, nvml.FI_GPU_RECOVERY_ACTION: action})
    fake_nvml([h100(0, nvmlDeviceGetFieldValues=r570), h100(1), h100(2, nvmlDeviceGetFieldValues=asking)])
    (finding,) = by_id(run_gpu(FakeSources()))["gpu.reset_required"]
    assert finding.severity == severity and finding.summary.startswith("GPU 2 (00000000:4C:00.0)")
    assert words in finding.summary and "GPU Recovery Action" in finding.evidence[0].excerpt
    assert "Drain the node" in finding.fix and "-i N" not in finding.fix


def test_recovery_none_and_reset_status_no_are_one_ok(fake_nvml: Callable[..., FakeNvml]) -> None:
    r570 = field_values({**R550_FIELDS, nvml.FI_GPU_RECOVERY_ACTION: 0})
    fake_nvml([h100(0, nvmlDeviceGetFieldValues=r570), h100(1)])
    (finding,) = by_id(run_gpu(FakeSources()))["gpu.reset_required"]
    assert finding.severity == Severity.OK and "2 GPU(s)" in finding.summary


def test_host_slot_limits_pcie_generation_via_nvml(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([h100(0), h100(1, nvmlDeviceGetMaxPcieLinkGeneration=4, nvmlDeviceGetCurrPcieLinkGeneration=4)])
    (gen,) = [f for f in by_id(run_gpu(FakeSources()))["gpu.pcie.gen"] if f.severity > Severity.OK]
    assert (
        gen.severity == Severity.WARN
        and "GPU 1" in gen.summary
        and "host slot supports PCIe gen 4" in gen.summary
    )


def test_exclusive_process_fails_when_ranks_share(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([h100(0, nvmlDeviceGetComputeMode=3), h100(1, nvmlDeviceGetComputeMode=3)])
    alone = by_id(run_gpu(FakeSources(env={"LOCAL_WORLD_SIZE": "2"})))["gpu.compute_mode"]
    assert {f.severity for f in alone} == {Severity.WARN}
    shared = by_id(run_gpu(FakeSources(env={"LOCAL_WORLD_SIZE": "4"})))["gpu.compute_mode"]
    assert {f.severity for f in shared} == {Severity.FAIL} and "4 local ranks share 2 GPU(s)" in shared[
        0
    ].summary


def test_prohibited_and_mig(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([h100(0, nvmlDeviceGetComputeMode=2), h100(1, nvmlDeviceGetMigMode=[1, 1])])
    ids = by_id(run_gpu(FakeSources(outputs={"torch-info": torch_info("12.4", count=1)})))
    assert (
        ids["gpu.compute_mode"][0].severity == Severity.FAIL
        and "Prohibited" in ids["gpu.compute_mode"][0].summary
    )
    (mig,) = ids["gpu.mig"]
    assert mig.severity == Severity.WARN and "GPU 1" in mig.summary
    # With MIG on, CUDA counts MIG instances: no device-count verdict.
    assert "gpu.torch_count" not in ids


def test_stray_processes_reported_with_pid_name_memory(fake_nvml: Callable[..., FakeNvml]) -> None:
    from types import SimpleNamespace

    fake_nvml(
        [h100(0, nvmlDeviceGetComputeRunningProcesses=[SimpleNamespace(pid=1, usedGpuMemory=3 * 1024**3)])]
    )
    (f,) = by_id(run_gpu(FakeSources()))["gpu.processes"]
    assert f.severity == Severity.WARN and "pid 1" in f.summary and "3072 MiB" in f.summary
    assert f.data["processes"][0]["pid"] == 1


def test_consumer_gpu_not_supported_everywhere_is_clean(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([consumer_gpu()])
    report = run_gpu(FakeSources())
    assert not [f for f in report.findings if f.severity >= Severity.WARN and f.id != "gpu.dmesg"], (
        report.findings
    )
    assert "gpu.inventory" in by_id(report)


def test_library_missing_without_gpus_skips(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    (f,) = run_gpu(FakeSources()).findings
    assert f.id == "gpu.driver" and f.severity == Severity.SKIP


def test_library_missing_with_nvidia_pci_devices_fails(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    pci = [{"bus_id": "0000:19:00.0", "class": "0x030200", "driver": None}]
    report = run_gpu(FakeSources(facts={"gpu-pci": pci}, outputs={"dmesg": ""}))
    (f,) = [f for f in report.findings if f.id == "gpu.driver"]
    assert f.severity == Severity.FAIL and "0000:19:00.0" in f.summary


def test_driver_mismatch_via_nvml_fails(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([], init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    out = (GPU / "nvidia-smi__nvml-driver-library-version-mismatch.txt").read_text()
    report = run_gpu(
        FakeSources(
            outputs={"nvidia-smi-q": CommandResult(argv=("nvidia-smi", "-q"), returncode=18, stdout=out)}
        )
    )
    (f,) = [f for f in report.findings if f.id == "gpu.nvml"]
    assert f.severity == Severity.FAIL


def test_nvml_broken_falls_back_to_nvidia_smi(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([], init_error=pynvml.NVML_ERROR_NO_PERMISSION)
    sources = FakeSources(outputs={"nvidia-smi-q": (GPU / A100_REMAP).read_text()})
    ids = by_id(run_gpu(sources))
    assert ids["gpu.nvml"][0].severity == Severity.WARN
    assert ids["gpu.remapped_rows.pending"][0].severity == Severity.FAIL
    assert "nvidia-smi-q" in sources.ran


# --- torch's CUDA build vs the driver -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch_cuda", "driver_cuda", "expected"),
    [
        ("12.4", 12040, Severity.OK),
        ("12.1", 12040, Severity.OK),
        ("12.4", 12020, Severity.WARN),
        ("12.1", 11060, Severity.FAIL),
        (None, 12040, Severity.FAIL),
    ],
)
def test_cuda_compat(
    fake_nvml: Callable[..., FakeNvml], torch_cuda: Optional[str], driver_cuda: int, expected: Severity
) -> None:
    fake_nvml(healthy(2), cuda=driver_cuda)
    ids = by_id(run_gpu(FakeSources(outputs={"torch-info": torch_info(torch_cuda, count=2)})))
    (f,) = ids["gpu.cuda_compat"]
    assert f.severity == expected, f.summary


def test_cuda_too_new_for_driver_message(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(healthy(8), cuda=11060, driver="510.73.08")
    warning = "CUDA initialization: The NVIDIA driver on your system is too old (found version 11060)."
    ids = by_id(run_gpu(FakeSources(outputs={"torch-info": torch_info("12.1", count=0, warning=warning)})))
    (compat,) = ids["gpu.cuda_compat"]
    assert "built for CUDA 12.1 but driver 510.73.08 supports only CUDA 11.6" in compat.summary
    assert "too old" in compat.evidence[0].excerpt
    (count,) = ids["gpu.torch_count"]
    assert count.severity == Severity.FAIL and "torch sees 0 GPU(s) but 8" in count.summary


@pytest.mark.parametrize(
    ("cvd", "torch_count", "expected"),
    [
        (None, 4, Severity.OK),
        ("0,1", 2, Severity.OK),
        ("0,1", 4, Severity.FAIL),
        ("0,7", 1, Severity.OK),
        ("2,,3", 1, Severity.OK),
    ],
)
def test_torch_count_through_cuda_visible_devices(
    fake_nvml: Callable[..., FakeNvml], cvd: Optional[str], torch_count: int, expected: Severity
) -> None:
    fake_nvml(healthy(4))
    env = {"CUDA_VISIBLE_DEVICES": cvd} if cvd is not None else {}
    ids = by_id(run_gpu(FakeSources(env=env, outputs={"torch-info": torch_info("12.4", count=torch_count)})))
    (f,) = ids["gpu.torch_count"]
    assert f.severity == expected, f.summary


def test_expected_cuda_count() -> None:
    gpus = [{"uuid": "GPU-aaaa"}, {"uuid": "GPU-bbbb"}]
    assert gpu_area.expected_cuda_count(gpus, None) == 2
    assert gpu_area.expected_cuda_count(gpus, "") == 0
    assert gpu_area.expected_cuda_count(gpus, "GPU-bb,0") == 2
    assert gpu_area.expected_cuda_count(gpus, "1,5,0") == 1  # CUDA stops at the unknown index 5
    assert gpu_area.expected_cuda_count(gpus, "MIG-GPU-aaaa/1/0") is None


def test_p2p_not_supported_from_topo_p2p_fallback(fake_nvml: Callable[..., FakeNvml]) -> None:
    # Two 2080 Ti behind one PCIe switch (same AutoDL machine for all three real samples): NVML gives no
    # P2P status here, so `nvidia-smi topo -p2p r` is read; the CUDA sample run on that machine agrees.
    from types import SimpleNamespace

    assert (
        "Device=0 CANNOT Access Peer Device=1"
        in (GPU / "p2pBandwidthLatencyTest__2x-rtx2080ti-cannot-access-peer.txt").read_text()
    )
    gpus = [
        dict(consumer_gpu(), nvmlDeviceGetPciInfo=SimpleNamespace(busId=f"00000000:B{4 + i}:00.0"))
        for i in range(2)
    ]
    fake_nvml(gpus)
    outputs = {
        "nvidia-smi-topo-m": (GPU / "nvidia-smi-topo-m__2x-rtx2080ti-autodl-container-pix.txt").read_text(),
        "nvidia-smi-topo-p2p": (GPU / "nvidia-smi-topo-p2p-p__2x-rtx2080ti-NS-not-supported.txt").read_text(),
    }
    ids = by_id(run_gpu(FakeSources(outputs=outputs)))
    (p2p,) = ids["gpu.p2p"]
    assert p2p.severity == Severity.WARN and "GPU0-GPU1 NS" in p2p.summary
    assert p2p.evidence[0].source == "nvidia-smi topo -p2p r" and "Not supported" in p2p.evidence[0].excerpt
    assert "1 PIX" in ids["gpu.topology"][0].summary


# --- second pass: inconclusive readings never read as a pass; fixes name the GPU -------------------------


def test_nvlink_counters_without_link_states_are_no_clean_bill(tmp_path: Path) -> None:
    # Only `nvidia-smi nvlink -e` in the snapshot: the links' states are unknown, so "all links active"
    # must not be claimed; the real counters (all 0) do give a clean error count.
    d = replay_dir(
        tmp_path,
        {
            "nvidia-smi-q.txt": H800,
            "nvidia-smi-nvlink-e.txt": "nvidia-smi-nvlink-e__h100-error-counters-zero-elided.txt",
        },
    )
    ids = by_id(run_gpu(ReplaySources(d)))
    assert "gpu.nvlink.inactive" not in ids
    assert worst(run_gpu(ReplaySources(d)), "gpu.nvlink.errors") == Severity.OK


def test_nvlink_counters_nvml_cannot_read_are_no_clean_bill(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([h100(0, nvmlDeviceGetNvLinkErrorCounter=Raise(pynvml.NVML_ERROR_NOT_SUPPORTED))])
    ids = by_id(run_gpu(FakeSources()))
    assert worst_of(ids["gpu.nvlink.inactive"]) == Severity.OK and "gpu.nvlink.errors" not in ids


def test_unknown_compute_mode_is_not_reported_as_default(tmp_path: Path) -> None:
    text = (GPU / H800).read_text()
    assert "    Compute Mode                          : Default\n" in text
    (tmp_path / "nvidia-smi-q.txt").write_text(
        text.replace(
            "Compute Mode                          : Default", "Compute Mode                          : Weird"
        )
    )
    (mode,) = by_id(run_gpu(ReplaySources(tmp_path)))["gpu.compute_mode"]
    assert mode.severity == Severity.INFO and "unrecognised compute mode 'Weird'" in mode.summary


def test_fixes_name_the_gpu_to_act_on(fake_nvml: Callable[..., FakeNvml]) -> None:
    gpus = healthy(4)
    gpus[3] = h100(
        3,
        nvmlDeviceGetRemappedRows=(0, 1, 1, 0),
        nvmlDeviceGetEnforcedPowerLimit=400000,
        nvmlDeviceGetComputeMode=3,
        nvmlDeviceGetComputeRunningProcesses=[SimpleNamespace(pid=1, usedGpuMemory=2**30)],
    )
    fake_nvml(gpus)
    ids = by_id(run_gpu(FakeSources(env={"LOCAL_WORLD_SIZE": "8"})))
    (remap,) = [f for f in ids["gpu.remapped_rows.pending"] if f.severity == Severity.FAIL]
    assert "nvidia-smi -r -i 3" in remap.fix and "-i N" not in remap.fix
    (power,) = ids["gpu.power_limit"]
    assert "sudo nvidia-smi -pl 700 -i 3" in power.fix
    (mode,) = ids["gpu.compute_mode"]
    assert mode.severity == Severity.FAIL and "nvidia-smi -c 0 -i 3" in mode.fix
    (procs,) = ids["gpu.processes"]
    assert "kill 1" in procs.fix and "ps -o pid,user,etime,args -p 1" in procs.fix


def test_wrong_typed_nvml_fact_is_conformed_and_other_gpus_judged(tmp_path: Path) -> None:
    fact = nvml.gather_nvml(FakeNvml(healthy(3)))
    fact["gpus"][0]["pcie"] = ["x16"]  # a section of the wrong type: unknown, not a crash
    fact["gpus"][1]["remapped_rows"]["pending"] = "Yes"  # a string for a bool: unknown
    fact["gpus"][1]["nvlink"]["links"]["0"] = None
    fact["gpus"][2]["pcie"]["width_current"] = 8  # the one real problem
    fact["gpus"].append("GPU 3")  # not a GPU record: dropped
    fact["p2p"] = {"gpus": "GPU0", "matrix": []}
    (tmp_path / "nvml.json").write_text(json.dumps(fact))
    ids = by_id(run_gpu(ReplaySources(tmp_path)))
    assert ids["gpu.inventory"][0].data["count"] == 3
    (width,) = [f for f in ids["gpu.pcie.width"] if f.severity == Severity.FAIL]
    assert width.summary.startswith("GPU 2 (00000000:4C:00.0)")
    assert worst_of(ids["gpu.remapped_rows.pending"]) == Severity.OK
    assert ids["gpu.remapped_rows.pending"][0].summary == "No row remapping pending on 2 GPU(s)"


def worst_of(findings: list[Finding]) -> Severity:
    return max(f.severity for f in findings)


# --- kernel log ---------------------------------------------------------------------------------------

XID_79 = "[ 5123.4] NVRM: Xid (PCI:0000:5d:00): 79, pid=0, GPU has fallen off the bus.\n"


def test_xid_79_and_fallen_off_bus_for_a_known_gpu(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(healthy(4))
    ids = by_id(
        run_gpu(
            FakeSources(
                outputs={
                    "dmesg": XID_79 + "[ 1.0] NVRM: Xid (PCI:0000:19:00): 13, Graphics SM Warp Exception\n"
                }
            )
        )
    )
    xids = {f.data["code"]: f for f in ids["gpu.xid"]}
    assert xids[79].severity == Severity.FAIL and xids[79].summary.startswith(
        "GPU 3 (00000000:5D:00.0): Xid 79"
    )
    assert xids[13].severity == Severity.INFO and "Graphics engine exception" in xids[13].summary
    assert "compute-sanitizer" in xids[13].fix or "CUDA_LAUNCH_BLOCKING" in xids[13].fix
    assert ids["gpu.fallen_off_bus"][0].severity == Severity.FAIL


def test_xid_reported_even_when_the_driver_is_gone(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml([], init_error=pynvml.NVML_ERROR_UNKNOWN)
    pci = [{"bus_id": "0000:5d:00.0", "class": "0x030200", "driver": "nvidia"}]
    ids = by_id(run_gpu(FakeSources(facts={"gpu-pci": pci}, outputs={"dmesg": XID_79})))
    assert ids["gpu.driver"][0].severity == Severity.FAIL
    assert ids["gpu.fallen_off_bus"][0].severity == Severity.FAIL


def test_dmesg_not_permitted_is_a_skip(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(healthy(1))
    denied = CommandResult(
        argv=("dmesg",), returncode=1, stderr="dmesg: read kernel buffer failed: Operation not permitted\n"
    )
    (f,) = by_id(run_gpu(FakeSources(outputs={"dmesg": denied})))["gpu.dmesg"]
    assert f.severity == Severity.SKIP and "not permitted" in f.summary


def test_pcie_limited_for_a_gpu_from_real_dmesg(fake_nvml: Callable[..., FakeNvml]) -> None:
    from types import SimpleNamespace

    # The real dmesg sample's devices (04:00.0, 8b:00.0) are the H100s of the same node's CSV sample.
    fake_nvml([h100(0, nvmlDeviceGetPciInfo=SimpleNamespace(busId="00000000:04:00.0"))])
    dmesg = (GPU / "dmesg-pcie__h100-bandwidth-limited-by-gen4-x16-link.txt").read_text()
    (f,) = by_id(run_gpu(FakeSources(outputs={"dmesg": dmesg})))["gpu.pcie.limited"]
    assert f.severity == Severity.WARN and f.summary.startswith(
        "GPU 0 (00000000:04:00.0): 252.048 Gb/s available"
    )


# --- snapshot -> replay, summary for other areas, rendering, CLI ------------------------------------


def test_snapshot_then_replay_gives_the_same_findings(
    fake_nvml: Callable[..., FakeNvml], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_collect, "_read_torch", lambda sources: (None, None))
    gpus = healthy(2)
    gpus[1] = h100(1, nvmlDeviceGetCurrPcieLinkWidth=8, nvmlDeviceGetRemappedRows=(0, 0, 1, 0))
    fake_nvml(gpus)
    rec = RecordingSources()
    live = run_checks(rec, [gpu_area.AREA], timeout_s=30)
    rec.write(tmp_path)
    assert json.loads((tmp_path / "nvml.json").read_text())["gpus"][1]["pcie"]["width_current"] == 8
    replayed = run_checks(ReplaySources(tmp_path), [gpu_area.AREA], timeout_s=30)
    assert sorted((f.id, f.severity, f.summary) for f in live.findings) == sorted(
        (f.id, f.severity, f.summary) for f in replayed.findings
    )
    assert {f.id for f in replayed.findings if f.severity == Severity.FAIL} >= {
        "gpu.pcie.width",
        "gpu.remapped_rows.pending",
    }


def test_snapshot_keeps_raw_nvidia_smi_q_when_nvml_works(
    fake_nvml: Callable[..., FakeNvml], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Support engineers read the raw `nvidia-smi -q` of a bug report: stored even though NVML answered.
    A stand-in nvidia-smi on PATH prints the real R580 output of the H100 node."""
    import os
    import stat

    monkeypatch.setattr(gpu_collect, "_read_torch", lambda sources: (None, None))
    fake_nvml(healthy(1))
    real = GPU / "real-h100" / "nvidia-smi-q.txt"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\n[ "$1" = "-q" ] && exec cat "{real}"\nexit 9\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    snap = tmp_path / "snap"
    result = CliRunner().invoke(app, ["snapshot", str(snap), "--only", "gpu", "--timeout", "30"])
    assert result.exit_code == 0, result.output
    assert (snap / "nvml.json").is_file()
    assert (snap / "nvidia-smi-q.txt").read_text() == real.read_text()


def test_gpu_area_and_other_readers_share_one_nvml_pass(fake_nvml: Callable[..., FakeNvml]) -> None:
    # rdma reads the GPU count (read_gpu_facts) while the gpu area runs: NVML must be read once.
    fake = fake_nvml(healthy(2))
    sources = FakeSources()
    assert gpu_area.read_gpu_facts(sources).count == 2
    report = run_gpu(sources)
    assert "gpu.inventory" in by_id(report)
    assert fake.inits == 1


def test_read_gpu_facts_summary(fake_nvml: Callable[..., FakeNvml]) -> None:
    fake_nvml(
        [
            h100(0),
            h100(
                1,
                nvmlDeviceGetComputeMode=3,
                nvmlDeviceGetNvLinkState=lambda h, link: (
                    1 if link < 2 else (_ for _ in ()).throw(pynvml.NVMLError(2))
                ),
            ),
        ]
    )
    sources = FakeSources()
    facts = gpu_area.read_gpu_facts(sources)
    assert facts.source == "nvml" and facts.count == 2 and facts.models == ["NVIDIA H100 80GB HBM3"]
    assert (facts.driver_version, facts.cuda_driver_version) == ("550.90.07", "12.4")
    assert facts.exclusive_gpus == [1] and facts.compute_modes == {0: "Default", 1: "Exclusive_Process"}
    assert facts.has_nvlink and facts.gpus[0].nvlink_active == 18 and facts.gpus[1].nvlink_active == 2
    assert (
        facts.gpus[0].nvlink_version == 4
        and facts.gpus[0].pcie_gen_max == 5
        and facts.gpus[0].pcie_width_current == 16
    )
    assert gpu_area.read_gpu_facts(sources) is facts  # read once per Sources


def test_read_gpu_facts_from_nvidia_smi_replay(tmp_path: Path) -> None:
    d = replay_dir(
        tmp_path,
        {
            "nvidia-smi-q.txt": H800,
            "nvidia-smi-nvlink-s.txt": "nvidia-smi-nvlink-s__8xh800-all-links-26GBps-elided.txt",
        },
    )
    facts = gpu_area.read_gpu_facts(ReplaySources(d))
    assert facts.source == "nvidia-smi" and facts.count == 1 and facts.driver_version == "525.105.17"
    assert facts.gpus[0].nvlink_active == 8 and facts.gpus[0].nvlink_speed_gbps == 26.562


def test_read_gpu_facts_without_gpus() -> None:
    facts = gpu_area.read_gpu_facts(
        FakeSources(
            facts={"nvml": {"available": False, "error": {"kind": "library_not_found", "message": "x"}}}
        )
    )
    assert facts.count == 0 and facts.source == "none" and facts.error == "x" and not facts.has_nvlink


def test_compact_topology_rendering() -> None:
    from ddpdoctor.parsers.nvidia_smi_topo import parse_topo_matrix

    topo = parse_topo_matrix(
        (GPU / "nvidia-smi-topo-m__4x-rtx6000ada-pcie-only-2numa-4nic-node-sys.txt").read_text()
    )
    text = topology_text(topo)
    lines = text.splitlines()
    assert lines[0].split() == ["G0", "G1", "G2", "G3", "N0", "N1", "N2", "N3"]
    assert lines[1].split() == ["G0", "X", "NODE", "SYS", "SYS", "NODE", "NODE", "SYS", "SYS"]
    assert lines[-1] == "NICs: N0=mlx5_0, N1=mlx5_1, N2=mlx5_2, N3=mlx5_3"
    assert max(len(x) for x in lines) <= 80
    assert topology_table(topo) is not None and topology_text(None) == "" and topology_table({}) is None


def test_cli_replay_json(tmp_path: Path) -> None:
    d = replay_dir(tmp_path, {"nvidia-smi-q.txt": A100_REMAP})
    res = CliRunner().invoke(app, ["check", "--only", "gpu", "--replay", str(d), "--json"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.output)
    fails = {f["id"] for f in data["findings"] if f["severity"] == "fail"}
    assert fails == {"gpu.remapped_rows.pending"}


def test_facts_not_in_snapshot_are_none() -> None:
    sources = FakeSources(
        facts={"nvml": NotAvailable("nvml.json not in snapshot"), "gpu-pci": NotAvailable("x")}, live=False
    )
    (f,) = run_gpu(sources).findings
    assert f.id == "gpu.driver" and f.severity == Severity.SKIP


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(SMI_LINES), max_size=40).map("\n".join))
def test_judging_any_nvidia_smi_text_never_raises(text: str) -> None:
    c = gpu_area.GpuCollected(replay=True)
    c.smi = CommandResult(argv=("nvidia-smi", "-q"), returncode=0, stdout=text)
    c.smi_parsed = parse_nvidia_smi_q(text)
    c.gpus = [dict(g) for g in c.smi_parsed["gpus"]]
    c.source = "nvidia-smi" if c.gpus else "none"
    c.dmesg = CommandResult(argv=("dmesg",), returncode=0, stdout=text)
    for f in gpu_area.check_gpu(c):
        assert f.id.startswith("gpu.") and f.summary


# --- on a real GPU node -------------------------------------------------------------------------------


@pytest.mark.gpu
def test_real_gpu_node_check() -> None:
    res = CliRunner().invoke(app, ["check", "--only", "gpu", "--json", "--timeout", "60"])
    data = json.loads(res.output)
    ids = {f["id"]: f for f in data["findings"]}
    assert "gpu.inventory" in ids and ids["gpu.inventory"]["data"]["count"] >= 1
    assert not [f for f in data["findings"] if f["severity"] == "error"], data["findings"]
    assert ids.get("gpu.cuda_compat", {}).get("severity") in ("ok", "warn", None)


@pytest.mark.gpu
def test_real_gpu_node_snapshot_replay(tmp_path: Path) -> None:
    assert (
        CliRunner().invoke(app, ["snapshot", str(tmp_path), "--only", "gpu", "--timeout", "60"]).exit_code
        == 0
    )
    assert (tmp_path / "nvml.json").is_file()
    res = CliRunner().invoke(app, ["check", "--only", "gpu", "--replay", str(tmp_path), "--json"])
    assert "gpu.inventory" in {f["id"] for f in json.loads(res.output)["findings"]}


@pytest.mark.gpu
def test_real_nvidia_smi_outputs_parse() -> None:
    from ddpdoctor.edge.runner import run_argv
    from ddpdoctor.parsers.nvidia_smi import parse_nvidia_smi_q
    from ddpdoctor.parsers.nvidia_smi_nvlink import parse_nvlink
    from ddpdoctor.parsers.nvidia_smi_topo import parse_topo_matrix

    q = run_argv(["nvidia-smi", "-q"], timeout_s=60)
    parsed = parse_nvidia_smi_q(q.stdout)
    assert (
        parsed["gpus"] and parsed["driver_version"] and all(g["name"] and g["uuid"] for g in parsed["gpus"])
    )
    topo = parse_topo_matrix(run_argv(["nvidia-smi", "topo", "-m"], timeout_s=30).stdout)
    assert topo["gpus"][0] == "GPU0" and len(topo["gpus"]) == len(parsed["gpus"])
    parse_nvlink(run_argv(["nvidia-smi", "nvlink", "-s"], timeout_s=30).stdout)
