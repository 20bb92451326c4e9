"""Judges of each GPU's own health: lost GPUs and failed readings, memory errors and repairs (ECC, retired
pages, remapped rows, reset required), the PCIe link, clocks, temperature, power limit and persistence.

Every judge here reads one per-GPU dict (nvml.GPU_SHAPE) and is pure; the tables at the bottom say which
finding id, NVML call and `nvidia-smi -q` section each one stands for.
Over 600 lines: one table of per-GPU judges over the same GPU dict; each judge is a short pure function.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ddpdoctor.checks.gpu.collect import GpuCollected
from ddpdoctor.checks.gpu.per_gpu import (
    PerGpuCheck,
    Verdict,
    evidence_source,
    fields_text,
    gpu_fix,
    gpu_label,
    live_gpus,
)
from ddpdoctor.core.model import Evidence, Finding, Severity, define

# PCIe replays: DCGM's PCIe diagnostic fails at 80 replays over a short test; this many since the last
# reset on a node about to run a job already points at a marginal link.
PCIE_REPLAY_WARN = 50
# Corrected memory errors are harmless one by one; hundreds since the last reset mean a weakening part.
ECC_CORRECTABLE_WARN = 100
# NVIDIA's RMA guidance for page retirement: 60 or more retired pages (single- and double-bit together).
RETIRED_PAGES_WARN = 60
# Degrees below the slowdown temperature (or T.Limit headroom, R535+) that count as "near".
TEMP_MARGIN_C = 5
# Idle GPUs legitimately drop to PCIe gen 1; only judge the generation under load.
PCIE_GEN_LOAD_PERCENT = 50
POWER_LIMIT_LOWERED_RATIO = 0.95
# Clock event reasons that cost speed and point at hardware or cooling; idle, application clocks,
# sync boost and display settings are normal.
HARMFUL_THROTTLE = {
    "hw_slowdown": Severity.FAIL,
    "hw_thermal_slowdown": Severity.FAIL,
    "hw_power_brake_slowdown": Severity.FAIL,
    "sw_thermal_slowdown": Severity.WARN,
}

LOST = define(
    "gpu.lost",
    "GPU lost",
    "NVML reports the GPU as lost or needing a reset (often after Xid 79, 'fallen off the bus'). Every "
    "job using it fails or hangs.",
    "Drain the node; reset the GPU (`sudo nvidia-smi -r -i N`) or reboot; check power, thermals and the PCIe "
    "slot/riser; RMA if it recurs.",
)
READINGS = define(
    "gpu.readings",
    "GPU readings",
    "Some NVML readings failed with an error other than 'not supported', so the checks that need them did "
    "not run for that GPU.",
    "Run `nvidia-smi -q -i N` by hand to see the failing fields; errors on many fields point to a GPU "
    "in a bad state.",
)
ECC_UNCORRECTABLE = define(
    "gpu.ecc.uncorrectable",
    "Uncorrectable ECC errors",
    "An uncorrectable memory error kills the process that hit it ('uncorrectable ECC error encountered') "
    "and, until the GPU is reset, may corrupt data. Volatile counts are since the last reset.",
    "Reset the GPU (`sudo nvidia-smi -r -i N`) or reboot, then run `dcgmi diag -r 3`; RMA if errors recur "
    "(per field practice, if aggregate SRAM uncorrectable errors exceed 4).",
)
ECC_CORRECTABLE = define(
    "gpu.ecc.correctable",
    "Corrected ECC errors",
    "Corrected memory errors do no harm one by one, but a high count since the last reset points at "
    "weakening memory, usually followed by row remapping or retired pages.",
    "Watch the counter (`nvidia-smi -q -d ECC -i N`); run `dcgmi diag -r 3` when it keeps rising.",
)
ECC_MODE = define(
    "gpu.ecc.mode",
    "ECC mode",
    "Whether ECC is on. A pending change only takes effect after a GPU reset or reboot.",
    "Reset the GPU (`sudo nvidia-smi -r -i N`) or reboot to apply the pending ECC mode.",
)
RETIRED_PAGES = define(
    "gpu.retired_pages",
    "Retired pages",
    "Pre-Ampere GPUs retire memory pages that had errors; a retirement pending a reset leaves the bad page "
    "in use, and 60 or more retired pages (single- and double-bit together) mean the board needs "
    "replacing.",
    "Reset the GPU (`sudo nvidia-smi -r -i N`) or reboot to retire the pending pages; RMA the board if the "
    "count keeps growing.",
)
REMAP_PENDING = define(
    "gpu.remapped_rows.pending",
    "Row remapping pending",
    "Ampere and newer GPUs replace a failing memory row with a spare, but only after a GPU reset; until "
    "then the bad row stays in use (often after Xid 63/94).",
    "Drain the node and reset the GPU (`sudo nvidia-smi -r -i N`) or reboot, then run `dcgmi diag -r 2`.",
)
REMAP_FAILURE = define(
    "gpu.remapped_rows.failure",
    "Row remapping failed",
    "The GPU could not remap a failing memory row (no spare left in the bank): the memory error will "
    "keep coming back.",
    "Drain the node and RMA the GPU.",
)
RESET_REQUIRED = define(
    "gpu.reset_required",
    "GPU reset required",
    "The driver says the GPU needs a reset, a reboot or a drain before it can be trusted again (`GPU "
    "Recovery Action` on R570+ drivers, `GPU Reset Status` before): jobs on it fail or corrupt data.",
    "Drain the node and reset the GPU (`sudo nvidia-smi -r -i N`) or reboot.",
)
PCIE_WIDTH = define(
    "gpu.pcie.width",
    "PCIe link width",
    "A GPU whose PCIe link trained narrower than it can (x8 or x4 instead of x16) moves host<->device and "
    "GPUDirect RDMA traffic at a fraction of the speed: data loading and inter-node collectives slow "
    "down without any error. Where the port above the GPU is itself narrower (a slot wired x8, a "
    "bifurcated slot), the slot is the limit and the finding is a warning.",
    "Reseat the GPU or riser, check the slot and cables, update the system BIOS; compare with `lspci -vvv` "
    "(LnkSta vs LnkCap).",
)
PCIE_GEN = define(
    "gpu.pcie.gen",
    "PCIe link generation",
    "Idle GPUs lower their PCIe generation to save power, so this is judged only under load; a GPU that "
    "stays below its maximum generation while busy, or a host slot slower than the GPU, caps "
    "host<->device bandwidth.",
    "Check under load (`nvidia-smi -q -d PCIE -i N` while a job runs); review the slot, switch and BIOS "
    "PCIe settings.",
)
PCIE_REPLAYS = define(
    "gpu.pcie.replays",
    "PCIe replays",
    "PCIe replays are link-level retransmissions; a high count since the last reset points at a marginal "
    "link (riser, slot, signal integrity) that slows transfers and can end in Xid 79.",
    "Reseat the GPU/riser; run `dcgmi diag -r 2` (PCIe test); RMA or replace the riser if it keeps rising.",
)
THROTTLE = define(
    "gpu.throttle",
    "Clock slowdown",
    "Hardware slowdown (thermal, power brake) or software thermal slowdown lowers the GPU clocks, so the "
    "slowest GPU sets the pace of every collective. Idle, application clocks and power-cap reasons are "
    "normal and not reported.",
    "Check cooling and fans, the PSU and power-brake signals (BMC logs), and "
    "`nvidia-smi -q -d PERFORMANCE -i N`.",
)
PERSISTENCE = define(
    "gpu.persistence",
    "Persistence mode",
    "With persistence mode off the driver tears GPU state down when the last client exits, so every job "
    "start pays a re-initialisation (seconds per GPU) and first-touch latency varies.",
    "Enable it: `sudo nvidia-smi -pm 1`, or better run `nvidia-persistenced`.",
)
TEMPERATURE = define(
    "gpu.temperature",
    "GPU temperature",
    "A GPU close to its slowdown temperature will throttle under load, slowing every rank that waits on it.",
    "Check airflow, fans and inlet temperature; compare with the other GPUs on the node.",
)
POWER_LIMIT = define(
    "gpu.power_limit",
    "Power limit",
    "A power limit set below the default caps the clocks of that GPU, and the slowest GPU sets the pace "
    "of every collective.",
    "Restore it: `sudo nvidia-smi -pl <default W> -i N` (check whether an admin capped it on purpose).",
)


def judge_lost(c: GpuCollected) -> list[Finding]:
    """A finding per lost GPU, and per GPU whose readings partly failed."""
    findings = []
    for g in c.gpus:
        if g.get("lost"):
            findings.append(
                LOST.finding(
                    Severity.FAIL,
                    f"{gpu_label(g)} is lost or needs a reset: {g.get('error') or 'no readings'}",
                    evidence=[Evidence("NVML", str(g.get("error") or ""))],
                    fix=gpu_fix(LOST.fix, g),
                    data={"gpu": g.get("index"), "bus_id": g.get("bus_id")},
                )
            )
        elif g.get("errors"):
            errs = g["errors"]
            findings.append(
                READINGS.finding(
                    Severity.WARN,
                    f"{gpu_label(g)}: {len(errs)} reading(s) failed, their checks did not run "
                    f"({', '.join(sorted(errs)[:5])})",
                    evidence=[Evidence("NVML", "\n".join(f"{k}: {v}" for k, v in sorted(errs.items())[:10]))],
                    fix=gpu_fix(READINGS.fix, g),
                    data={"gpu": g.get("index"), "errors": dict(errs)},
                )
            )
    return findings


# --- memory: ECC, retired pages, remapped rows ------------------------------------------------------------


def _ecc(g: Mapping[str, Any], counter: str) -> Mapping[str, Any]:
    return (g.get("ecc") or {}).get(counter) or {}


def ecc_excerpt(g: Mapping[str, Any]) -> str:
    v, a = _ecc(g, "volatile"), _ecc(g, "aggregate")
    return (
        f"volatile correctable={v.get('correctable')} uncorrectable={v.get('uncorrectable')}; "
        f"aggregate correctable={a.get('correctable')} uncorrectable={a.get('uncorrectable')}"
    )


def judge_uncorrectable_ecc(g: Mapping[str, Any]) -> Optional[Verdict]:
    vol, agg = _ecc(g, "volatile").get("uncorrectable"), _ecc(g, "aggregate").get("uncorrectable")
    if vol is None and agg is None:
        return None
    data = {"volatile": vol, "aggregate": agg}
    if vol:
        return Verdict(Severity.FAIL, f"{vol} uncorrectable ECC error(s) since the last reset", data)
    if agg:
        return Verdict(
            Severity.WARN,
            f"{agg} uncorrectable ECC error(s) in the GPU's lifetime (none since the last reset)",
            data,
        )
    return Verdict(Severity.OK, "", data)


def judge_correctable_ecc(g: Mapping[str, Any]) -> Optional[Verdict]:
    vol = _ecc(g, "volatile").get("correctable")
    if vol is None:
        return None
    if vol >= ECC_CORRECTABLE_WARN:
        return Verdict(Severity.WARN, f"{vol} corrected ECC errors since the last reset", {"volatile": vol})
    if vol:
        return Verdict(Severity.INFO, f"{vol} corrected ECC error(s) since the last reset", {"volatile": vol})
    return Verdict(Severity.OK, "", {"volatile": vol})


def judge_ecc_mode(g: Mapping[str, Any]) -> Optional[Verdict]:
    m = g.get("ecc_mode") or {}
    cur, pend = m.get("current"), m.get("pending")
    if cur is None:
        return None
    if pend is not None and pend != cur:
        return Verdict(
            Severity.WARN,
            f"ECC is {'on' if cur else 'off'} but {'on' if pend else 'off'} is pending a reset",
            {"current": cur, "pending": pend},
        )
    if cur is False:
        return Verdict(
            Severity.INFO,
            "ECC is disabled (memory errors go undetected)",
            {"current": cur},
            fix=gpu_fix(
                "If this GPU should detect memory errors: `sudo nvidia-smi -e 1 -i N`, then reset it "
                "(`sudo nvidia-smi -r -i N`) or reboot.",
                g,
            ),
        )
    return Verdict(Severity.OK, "", {"current": cur})


def judge_retired_pages(g: Mapping[str, Any]) -> Optional[Verdict]:
    rp = g.get("retired_pages") or {}
    if rp.get("pending") is None and rp.get("double_bit") is None:
        return None
    if rp.get("pending"):
        return Verdict(
            Severity.FAIL, "page retirement pending: reset the GPU to retire the bad pages", dict(rp)
        )
    if (rp.get("double_bit") or 0) + (rp.get("single_bit") or 0) >= RETIRED_PAGES_WARN:
        return Verdict(
            Severity.WARN,
            f"{rp.get('double_bit')} double-bit and {rp.get('single_bit')} single-bit pages retired",
            dict(rp),
        )
    return Verdict(Severity.OK, "", dict(rp))


def _rows(g: Mapping[str, Any]) -> Mapping[str, Any]:
    return g.get("remapped_rows") or {}


def judge_remap_pending(g: Mapping[str, Any]) -> Optional[Verdict]:
    rr = _rows(g)
    if rr.get("pending") is None:
        return None
    if rr["pending"]:
        return Verdict(
            Severity.FAIL,
            f"row remapping pending a GPU reset (correctable rows {rr.get('correctable')}, uncorrectable "
            f"rows {rr.get('uncorrectable')})",
            dict(rr),
        )
    return Verdict(Severity.OK, "", dict(rr))


def judge_remap_failure(g: Mapping[str, Any]) -> Optional[Verdict]:
    rr = _rows(g)
    if rr.get("failure") is None:
        return None
    if rr["failure"]:
        return Verdict(Severity.FAIL, "row remapping failed: the memory cannot be repaired (RMA)", dict(rr))
    return Verdict(Severity.OK, "", dict(rr))


def remap_excerpt(g: Mapping[str, Any]) -> str:
    rr = _rows(g)
    return (
        f"Remapped Rows: Correctable Error {rr.get('correctable')}, Uncorrectable Error {rr.get('uncorrectable')}, "
        f"Pending {rr.get('pending')}, Remapping Failure Occurred {rr.get('failure')}"
    )


# `GPU Recovery Action` (R570+): what the driver says it takes before the GPU can be trusted again.
_RECOVERY_VERDICTS: dict[str, tuple[Severity, str, str]] = {
    "reset": (Severity.FAIL, "the driver says the GPU needs a reset", "`sudo nvidia-smi -r -i N`"),
    "bus_reset": (Severity.FAIL, "the driver says the GPU needs a PCIe bus reset", "a bus reset or reboot"),
    "reboot": (Severity.FAIL, "the driver says the node needs a reboot to recover the GPU", "a reboot"),
    "system_reboot": (
        Severity.FAIL,
        "the driver says the system needs a reboot to recover the GPU",
        "a reboot",
    ),
    "drain_p2p": (
        Severity.FAIL,
        "the driver asks to drain peer-to-peer (NVLink) traffic: NCCL's intra-node path is unusable",
        "draining P2P work, then `sudo nvidia-smi -r -i N`",
    ),
    "drain_and_reset": (
        Severity.WARN,
        "the driver recommends draining and resetting the GPU",
        "draining, then `sudo nvidia-smi -r -i N`",
    ),
    "recover_imex_domain": (
        Severity.FAIL,
        "the driver says the GPU's IMEX domain (multi-node NVLink) needs recovery",
        "recovering the IMEX domain (restart the IMEX daemons of the NVLink domain)",
    ),
}


def judge_reset_required(g: Mapping[str, Any]) -> Optional[Verdict]:
    action = g.get("recovery_action")
    req, drain = g.get("reset_required"), g.get("drain_and_reset_recommended")
    if action is not None and action != "none":
        severity, text, remedy = _RECOVERY_VERDICTS.get(
            action,
            (Severity.WARN, f"the driver reports recovery action {action!r}", "the action the driver names"),
        )
        fix = gpu_fix(
            f"Drain the node; recover the GPU with {remedy}; check `dmesg` for the Xid that caused it.", g
        )
        return Verdict(severity, f"{text} (GPU Recovery Action: {action})", {"recovery_action": action}, fix)
    if req:
        return Verdict(Severity.FAIL, "the driver says a GPU reset is required", {"reset_required": req})
    if drain:
        return Verdict(
            Severity.WARN, "the driver recommends draining and resetting the GPU", {"drain": drain}
        )
    if action is None and req is None and drain is None:
        return None
    return Verdict(Severity.OK, "", {})


MEMORY_CHECKS = (
    PerGpuCheck(
        ECC_UNCORRECTABLE,
        judge_uncorrectable_ecc,
        "nvmlDeviceGetTotalEccErrors",
        "ECC Errors",
        "No uncorrectable ECC errors on {n} GPU(s)",
        ecc_excerpt,
    ),
    PerGpuCheck(
        ECC_CORRECTABLE,
        judge_correctable_ecc,
        "nvmlDeviceGetTotalEccErrors",
        "ECC Errors",
        "No corrected ECC errors on {n} GPU(s)",
        ecc_excerpt,
    ),
    PerGpuCheck(
        ECC_MODE,
        judge_ecc_mode,
        "nvmlDeviceGetEccMode",
        "ECC Mode",
        "ECC enabled on {n} GPU(s)",
        lambda g: (
            f"current={(g.get('ecc_mode') or {}).get('current')} pending={(g.get('ecc_mode') or {}).get('pending')}"
        ),
    ),
    PerGpuCheck(
        RETIRED_PAGES,
        judge_retired_pages,
        "nvmlDeviceGetRetiredPages",
        "Retired Pages",
        "No page retirement pending on {n} GPU(s)",
        lambda g: fields_text(g.get("retired_pages")),
    ),
    PerGpuCheck(
        REMAP_PENDING,
        judge_remap_pending,
        "nvmlDeviceGetRemappedRows",
        "Remapped Rows",
        "No row remapping pending on {n} GPU(s)",
        remap_excerpt,
    ),
    PerGpuCheck(
        REMAP_FAILURE,
        judge_remap_failure,
        "nvmlDeviceGetRemappedRows",
        "Remapped Rows",
        "No row remapping failure on {n} GPU(s)",
        remap_excerpt,
    ),
    PerGpuCheck(
        RESET_REQUIRED,
        judge_reset_required,
        "nvmlDeviceGetFieldValues(GPU_RECOVERY_ACTION, RESET_STATUS)",
        "GPU Recovery Action / GPU Reset Status",
        "No GPU reset required on {n} GPU(s)",
        lambda g: (
            f"GPU Recovery Action {g.get('recovery_action')}; Reset Required {g.get('reset_required')}, "
            f"Drain and Reset Recommended {g.get('drain_and_reset_recommended')}"
        ),
    ),
)


# --- the PCIe link ---------------------------------------------------------------------------------------------


def _pcie(g: Mapping[str, Any]) -> Mapping[str, Any]:
    return g.get("pcie") or {}


def pcie_excerpt(g: Mapping[str, Any]) -> str:
    p = _pcie(g)
    return (
        f"PCIe Generation Current {p.get('gen_current')} Max {p.get('gen_max')} (device {p.get('gen_device_max')}, "
        f"host {p.get('gen_host_max')}); Link Width Current {p.get('width_current')}x Max {p.get('width_max')}x"
        + (f" (slot {p['slot_bus_id']} x{p['slot_width_max']})" if p.get("slot_width_max") else "")
        + "; "
        f"Replays Since Reset {p.get('replays')}"
    )


def judge_pcie_width(g: Mapping[str, Any]) -> Optional[Verdict]:
    p = _pcie(g)
    cur, mx, slot = p.get("width_current"), p.get("width_max"), p.get("slot_width_max")
    if cur is None or mx is None:
        return None
    data = {"current": cur, "max": mx, "slot_max": slot}
    if cur >= mx:
        return Verdict(Severity.OK, "", data)
    if slot is not None and cur >= slot:
        # The GPU trained as wide as the port above it allows: the slot, not the link, is narrow.
        return Verdict(
            Severity.WARN,
            f"PCIe link runs at x{cur}: the slot (port {p.get('slot_bus_id')}) is x{slot}, the GPU could use x{mx}",
            data,
            "Host<->GPU and GPUDirect RDMA traffic get a fraction of the bandwidth: move the GPU to a x"
            f"{mx} slot, or check the BIOS lane bifurcation setting for that slot.",
        )
    where = f" (the slot allows x{slot})" if slot is not None else ""
    return Verdict(Severity.FAIL, f"PCIe link runs at x{cur}, below its x{mx} maximum{where}", data)


def judge_pcie_gen(g: Mapping[str, Any]) -> Optional[Verdict]:
    p = _pcie(g)
    cur, mx = p.get("gen_current"), p.get("gen_max")
    dev, host = p.get("gen_device_max"), p.get("gen_host_max")
    util = (g.get("utilization") or {}).get("gpu_percent")
    if cur is None or mx is None:
        return None
    data = {"current": cur, "max": mx, "device_max": dev, "host_max": host, "utilization": util}
    if dev is not None and host is not None and host < dev:
        return Verdict(
            Severity.WARN, f"the host slot supports PCIe gen {host}, below the GPU's gen {dev}", data
        )
    if cur < mx and util is not None and util >= PCIE_GEN_LOAD_PERCENT:
        return Verdict(
            Severity.WARN, f"PCIe gen {cur} under load ({util}% busy), below its gen {mx} maximum", data
        )
    return Verdict(Severity.OK, "", data)  # an idle GPU below its maximum has downshifted: not a finding


def judge_pcie_replays(g: Mapping[str, Any]) -> Optional[Verdict]:
    n, roll = _pcie(g).get("replays"), _pcie(g).get("replay_rollovers")
    if n is None:
        return None
    if (roll or 0) > 0 or n >= PCIE_REPLAY_WARN:
        extra = f" ({roll} counter rollovers)" if roll else ""
        return Verdict(
            Severity.WARN, f"{n} PCIe replays since the last reset{extra}", {"replays": n, "rollovers": roll}
        )
    return Verdict(Severity.OK, "", {"replays": n})


PCIE_CHECKS = (
    PerGpuCheck(
        PCIE_WIDTH,
        judge_pcie_width,
        "nvmlDeviceGetCurrPcieLinkWidth/MaxPcieLinkWidth",
        "PCI > GPU Link Info",
        "PCIe link width at maximum on {n} GPU(s)",
        pcie_excerpt,
    ),
    PerGpuCheck(
        PCIE_GEN,
        judge_pcie_gen,
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "PCIe Generation",
        "PCIe generation fine on {n} GPU(s) (idle GPUs downshift; judged under load only)",
        pcie_excerpt,
    ),
    PerGpuCheck(
        PCIE_REPLAYS,
        judge_pcie_replays,
        "nvmlDeviceGetPcieReplayCounter",
        "Replays Since Reset",
        f"Fewer than {PCIE_REPLAY_WARN} PCIe replays on {{n}} GPU(s)",
        pcie_excerpt,
    ),
)


# --- clocks, temperature, power, persistence ---------------------------------------------------------------


def judge_throttle(g: Mapping[str, Any]) -> Optional[Verdict]:
    reasons = g.get("throttle_reasons") or {}
    if not reasons:
        return None
    active = [r for r, on in reasons.items() if on and r in HARMFUL_THROTTLE]
    if not active:
        return Verdict(Severity.OK, "", {"active": [r for r, on in reasons.items() if on]})
    severity = max(HARMFUL_THROTTLE[r] for r in active)
    return Verdict(
        severity, "clocks slowed by " + ", ".join(r.replace("_", " ") for r in active), {"active": active}
    )


def judge_temperature(g: Mapping[str, Any]) -> Optional[Verdict]:
    t = g.get("temperature") or {}
    cur, slow, headroom = t.get("gpu_c"), t.get("slowdown_c"), t.get("t_limit_c")
    if cur is None:
        return None
    data = {"gpu_c": cur, "slowdown_c": slow, "t_limit_c": headroom}
    if slow is not None and slow > 0 and cur >= slow - TEMP_MARGIN_C:
        return Verdict(
            Severity.WARN, f"{cur} C, within {TEMP_MARGIN_C} C of the {slow} C slowdown temperature", data
        )
    if headroom is not None and headroom <= TEMP_MARGIN_C:
        return Verdict(Severity.WARN, f"{cur} C, only {headroom} C below the T.Limit", data)
    return Verdict(Severity.OK, "", data)


def judge_power_limit(g: Mapping[str, Any]) -> Optional[Verdict]:
    p = g.get("power") or {}
    lim, default = p.get("limit_w"), p.get("default_limit_w")
    if lim is None or default is None or default <= 0:
        return None
    requested, module = p.get("requested_limit_w"), p.get("module_limit_w")
    data = {
        "limit_w": lim,
        "default_limit_w": default,
        "requested_limit_w": requested,
        "draw_w": p.get("draw_w"),
    }
    floor = default * POWER_LIMIT_LOWERED_RATIO
    if lim >= floor:
        return Verdict(Severity.OK, "", data)
    if requested is None or requested < floor:
        fix = POWER_LIMIT.fix.replace("<default W>", f"{default:g}")
        return Verdict(
            Severity.WARN, f"power limit {lim:g} W, below the default {default:g} W", data, gpu_fix(fix, g)
        )
    # Nobody lowered the requested limit: the platform enforces less than was asked for.
    if module is not None:
        return Verdict(
            Severity.INFO,
            f"enforced power limit {lim:g} W below the requested {requested:g} W: the module's {module:g} W "
            "budget is shared with the CPU (Grace Hopper/Blackwell power sharing)",
            {**data, "module_limit_w": module},
        )
    return Verdict(
        Severity.WARN,
        f"the platform enforces {lim:g} W though {requested:g} W is requested (default {default:g} W)",
        data,
        "Nothing on the GPU lowered it: look for a chassis or BMC power cap (Redfish/IPMI power capping), "
        "a power brake from the PSUs, or a datacenter power policy; `nvidia-smi -q -d POWER,PERFORMANCE` "
        "shows the limits and the active slowdown reasons.",
    )


CLOCK_CHECKS = (
    PerGpuCheck(
        THROTTLE,
        judge_throttle,
        "nvmlDeviceGetCurrentClocksEventReasons",
        "Clocks Event/Throttle Reasons",
        "No hardware or thermal clock slowdown on {n} GPU(s)",
        lambda g: ", ".join(
            f"{k}={'Active' if v else 'Not Active'}" for k, v in (g.get("throttle_reasons") or {}).items()
        ),
    ),
    PerGpuCheck(
        TEMPERATURE,
        judge_temperature,
        "nvmlDeviceGetTemperature",
        "Temperature",
        "Temperatures well below slowdown on {n} GPU(s)",
        lambda g: fields_text(g.get("temperature")),
    ),
    PerGpuCheck(
        POWER_LIMIT,
        judge_power_limit,
        "nvmlDeviceGetEnforcedPowerLimit",
        "Power Readings",
        "Power limits at default on {n} GPU(s)",
        lambda g: fields_text(g.get("power")),
    ),
)


def judge_persistence(c: GpuCollected) -> list[Finding]:
    """One finding for the node: which GPUs run without persistence mode."""
    source = evidence_source(c, "nvmlDeviceGetPersistenceMode", "Persistence Mode")
    known = [g for g in live_gpus(c) if g.get("persistence_mode") is not None]
    off = [g for g in known if g.get("persistence_mode") is False]
    if off:
        return [
            PERSISTENCE.finding(
                Severity.INFO,
                f"Persistence mode is off on {len(off)} of {len(known)} GPU(s): "
                + ", ".join(gpu_label(g) for g in off[:8])
                + (" ..." if len(off) > 8 else ""),
                evidence=[Evidence(source, "Disabled")],
                fix=PERSISTENCE.fix,
                data={"gpus": [g.get("index") for g in off]},
            )
        ]
    if known:
        return [
            PERSISTENCE.finding(
                Severity.OK, f"Persistence mode on for {len(known)} GPU(s)", evidence=[Evidence(source)]
            )
        ]
    return []
