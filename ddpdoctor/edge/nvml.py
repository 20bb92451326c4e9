"""The one place that imports pynvml.

Lazy: pynvml is imported and NVML initialised only when `gather_nvml()` runs. Every call goes
through `NvmlReader.query`, which maps NVML errors once:

- Not Supported / Function Not Found (and bindings too old to have the function) -> None: that is
  data ("this GPU does not report it"), never a failure;
- GPU Is Lost / GPU Requires Reset -> `GpuLost`, which stops reading that GPU only and marks it
  `lost` (the checks turn that into a fail);
- anything else -> None, with the message kept in the GPU's `errors` so the report can say why.

Init failures (library not found, driver/library version mismatch, driver not loaded, no permission)
come back as `{"available": False, "error": {"kind", "message"}}`. One failing GPU never stops the
others. The result is plain JSON-able data, stored in snapshots as the `nvml` fact, with per-GPU dicts
in the same shape as `ddpdoctor.parsers.nvidia_smi.parse_gpu_section`.
Over 600 lines as one module on purpose: it is the only importer of pynvml, and every NVML call, constant and error mapping must stay behind that one door.
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from typing import Any, Callable, Optional

from ddpdoctor.edge.json_shape import InRange, ListOf, Loose, MapOf, Nullable, Record, conform, conform_fact
from ddpdoctor.parsers.nvidia_smi import RECOVERY_ACTIONS

# NVML return codes (nvml.h); kept here so that mapping does not depend on the bindings' version.
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

ERROR_KINDS = {
    NVML_ERROR_NOT_SUPPORTED: "not_supported",
    NVML_ERROR_FUNCTION_NOT_FOUND: "not_supported",
    NVML_ERROR_GPU_IS_LOST: "lost",
    NVML_ERROR_RESET_REQUIRED: "lost",
    NVML_ERROR_LIBRARY_NOT_FOUND: "library_not_found",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_mismatch",
    NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    NVML_ERROR_NO_PERMISSION: "no_permission",
}

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
# nvmlClocksEventReasons bits, named as `nvidia-smi -q` names them (snake case).
CLOCK_EVENT_BITS = {
    "idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# nvmlGpuP2PStatus_t, as `nvidia-smi topo -p2p` abbreviates it.
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
# nvmlDeviceArchitecture_t, named as `nvidia-smi -q` prints "Product Architecture" (so NVML and the
# nvidia-smi fallback give the same text). 0xffffffff is NVML_DEVICE_ARCH_UNKNOWN.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
FABRIC_STATES = {0: None, 1: "Not Started", 2: "In Progress", 3: "Completed"}
# nvmlDeviceGetFieldValues ids (nvml.h), for readings that have no call of their own.
FI_NVLINK_SPEED_MBPS = (84, 85, 86, 87, 88, 89, 132, 133, 134, 135, 136, 137)  # links 0-11
FI_NVLINK_SPEED_MBPS_COMMON = 90
FI_NVLINK_GET_SPEED = 164  # scoped by link number; the only id for links past 11 (H100: 18 links)
FI_RESET_STATUS = 226  # R535-R565; deprecated by the recovery action
FI_DRAIN_AND_RESET_STATUS = 227
FI_GPU_RECOVERY_ACTION = 230
FI_POWER_CURRENT_LIMIT = 190  # scoped by NVML_POWER_SCOPE_*: the module's limit on GH200/GB200
POWER_SCOPE_MODULE = 1  # R570+: NVML_GPU_RECOVERY_ACTION_* (0..7, RECOVERY_ACTIONS' order)
# nvmlValueType_t -> the c_nvmlValue_t union member that holds it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
NVLINK_MAX_LINKS = 18  # NVML allows up to 36, but no shipping GPU has more than 18 (H100/H200)

_LOCK = threading.Lock()


def _shutdown(lib: Any) -> None:
    """nvmlShutdown after every init (NVML counts them): its failures change nothing we report."""
    try:
        lib.nvmlShutdown()
    except Exception:  # noqa: BLE001, S110 - see above
        pass


class GpuLost(Exception):
    """NVML said the GPU is lost or needs a reset: stop reading it, report it as lost."""


def classify_error(exc: BaseException) -> str:
    """Map an NVML exception (or anything the bindings raised) to a kind, once."""
    code = getattr(exc, "value", None)
    if isinstance(code, int):
        return ERROR_KINDS.get(code, "error")
    return "error"


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return str(value).strip("\x00").strip() or None


class NvmlReader:
    """Runs NVML calls through one helper and remembers, per field, why a reading is missing."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        self.errors: dict[str, str] = {}

    def query(self, field: str, func: str, *args: Any, quiet: bool = False) -> Any:
        """`lib.func(*args)`, or None when unsupported or failed; raises GpuLost for a lost GPU.

        `quiet` leaves a failure out of `errors` (for probing calls such as NVLink link numbers).
        """
        fn: Optional[Callable[..., Any]] = getattr(self.lib, func, None)
        if fn is None:
            return None  # bindings too old to know the call: same as not supported
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - every NVML failure is mapped here, once
            kind = classify_error(exc)
            if kind == "lost":
                raise GpuLost(f"{func}: {exc}") from None
            if kind != "not_supported" and not quiet:
                self.errors[field] = f"{func}: {exc}"
            return None


def _bool(value: Any) -> Optional[bool]:
    return None if value is None else bool(value)


def _mib(value: Any) -> Optional[int]:
    return None if value is None else int(value) // (1024 * 1024)


def _watts(milliwatts: Any) -> Optional[float]:
    return None if milliwatts is None else round(float(milliwatts) / 1000.0, 2)


def _pair(value: Any) -> dict[str, Optional[bool]]:
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        return {"current": _bool(value[0]), "pending": _bool(value[1])}
    return {"current": None, "pending": None}


def _sum(*values: Optional[int]) -> Optional[int]:
    seen = [v for v in values if v is not None]
    return sum(seen) if seen else None


def _ecc(r: NvmlReader, handle: Any, counter: int, label: str) -> dict[str, Optional[int]]:
    # errorType 0 = corrected, 1 = uncorrected; location 2 = DRAM (device memory), 7 = SRAM.
    corr = r.query(f"ecc.{label}.correctable", "nvmlDeviceGetTotalEccErrors", handle, 0, counter)
    unc = r.query(f"ecc.{label}.uncorrectable", "nvmlDeviceGetTotalEccErrors", handle, 1, counter)
    loc = {}
    for name, err_type, location in (
        ("sram_correctable", 0, 7),
        ("sram_uncorrectable", 1, 7),
        ("dram_correctable", 0, 2),
        ("dram_uncorrectable", 1, 2),
    ):
        loc[name] = r.query(
            f"ecc.{label}.{name}",
            "nvmlDeviceGetMemoryErrorCounter",
            handle,
            err_type,
            counter,
            location,
            quiet=True,
        )
    return {
        "correctable": corr if corr is not None else _sum(loc["sram_correctable"], loc["dram_correctable"]),
        "uncorrectable": unc
        if unc is not None
        else _sum(loc["sram_uncorrectable"], loc["dram_uncorrectable"]),
        **loc,
    }


def _processes(r: NvmlReader, handle: Any) -> Optional[list[dict[str, Any]]]:
    procs: list[dict[str, Any]] = []
    seen_any = False
    for kind, func in (
        ("C", "nvmlDeviceGetComputeRunningProcesses"),
        ("G", "nvmlDeviceGetGraphicsRunningProcesses"),
    ):
        listed = r.query(f"processes.{kind}", func, handle)
        if listed is None:
            continue
        seen_any = True
        for p in listed:
            pid = getattr(p, "pid", None)
            used = getattr(p, "usedGpuMemory", None)
            procs.append(
                {"pid": pid, "type": kind, "name": None, "user": None, "used_memory_mib": _mib(used)}
            )
    if not seen_any:
        return None
    _name_processes(procs)
    return procs


def _name_processes(procs: list[dict[str, Any]]) -> None:
    """Fill in name and user from the process table; PIDs of other containers stay unnamed."""
    try:
        import psutil
    except ImportError:
        return
    for p in procs:
        if not isinstance(p.get("pid"), int):
            continue
        try:
            proc = psutil.Process(p["pid"])
            p["name"] = proc.name()
            p["user"] = proc.username()
        except (psutil.Error, OSError, KeyError):
            pass


def _field_value(r: NvmlReader, field: str, handle: Any, field_id: int, scope: Optional[int] = None) -> Any:
    """One nvmlDeviceGetFieldValues reading as a number; None when the driver does not know the id.

    The call itself succeeds for unknown ids: each value carries its own return code.
    """
    request = [(field_id, scope) if scope is not None else field_id]
    values = r.query(field, "nvmlDeviceGetFieldValues", handle, request, quiet=True)
    if not values:
        return None
    value = values[0]
    if getattr(value, "nvmlReturn", None) != 0:
        return None
    member = _VALUE_MEMBERS.get(getattr(value, "valueType", 1), "uiVal")
    number = getattr(getattr(value, "value", None), member, None)
    return number if isinstance(number, (int, float)) else None


def _nvlink_speed_gbps(r: NvmlReader, handle: Any, link: int) -> Optional[float]:
    """A link's speed in GB/s, as `nvidia-smi nvlink -s` prints it (26.562 GB/s on H100)."""
    mbps = _field_value(r, f"nvlink.{link}.speed", handle, FI_NVLINK_GET_SPEED, link)
    if mbps is None and link < len(FI_NVLINK_SPEED_MBPS):
        mbps = _field_value(r, f"nvlink.{link}.speed", handle, FI_NVLINK_SPEED_MBPS[link])
    if mbps is None:
        mbps = _field_value(r, f"nvlink.{link}.speed", handle, FI_NVLINK_SPEED_MBPS_COMMON)
    return round(mbps / 1000, 3) if mbps else None


def _recovery(r: NvmlReader, handle: Any) -> dict[str, Any]:
    """What the driver says it takes to recover the GPU: `GPU Recovery Action` (R570+), or the older
    `GPU Reset Status` pair (Reset Required, Drain and Reset Recommended)."""
    action = _field_value(r, "recovery_action", handle, FI_GPU_RECOVERY_ACTION)
    reset = _field_value(r, "reset_required", handle, FI_RESET_STATUS)
    drain = _field_value(r, "drain_and_reset_recommended", handle, FI_DRAIN_AND_RESET_STATUS)
    named = None
    if isinstance(action, int):
        named = RECOVERY_ACTIONS[action] if 0 <= action < len(RECOVERY_ACTIONS) else f"action_{action}"
    return {
        "recovery_action": named,
        "reset_required": _bool(reset),
        "drain_and_reset_recommended": _bool(drain),
    }


def _nvlink(r: NvmlReader, handle: Any) -> Optional[dict[str, Any]]:
    links: dict[str, Any] = {}
    for link in range(NVLINK_MAX_LINKS):
        # Link numbers past the GPU's last link answer Not Supported or Invalid Argument: stop there.
        state = r.query(f"nvlink.{link}.state", "nvmlDeviceGetNvLinkState", handle, link, quiet=True)
        if state is None:
            break
        errors = {}
        for name, counter in (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3)):
            errors[name] = r.query(
                f"nvlink.{link}.{name}", "nvmlDeviceGetNvLinkErrorCounter", handle, link, counter, quiet=True
            )
        crc = _sum(errors.pop("crc_flit"), errors.pop("crc_data"))
        links[str(link)] = {
            "active": bool(state),
            "speed_gbps": _nvlink_speed_gbps(r, handle, link) if state else None,
            "version": r.query(
                f"nvlink.{link}.version", "nvmlDeviceGetNvLinkVersion", handle, link, quiet=True
            ),
            "errors": {**errors, "crc": crc},
        }
    return {"links": links} if links else None


def _fabric(r: NvmlReader, handle: Any) -> dict[str, Optional[str]]:
    struct_type = getattr(r.lib, "c_nvmlGpuFabricInfo_t", None)
    if struct_type is None:
        return {"state": None, "status": None}
    info = struct_type()
    arg = ctypes.byref(info) if isinstance(info, ctypes.Structure) else info
    if (
        r.query("fabric", "nvmlDeviceGetGpuFabricInfo", handle, arg) is None
        and getattr(info, "state", 0) == 0
    ):
        return {"state": None, "status": None}
    state = FABRIC_STATES.get(int(getattr(info, "state", 0)), f"state {getattr(info, 'state', '?')}")
    status_code = getattr(info, "status", None)
    status = None if state is None else ("Success" if status_code == 0 else f"NVML error {status_code}")
    return {"state": state, "status": status}


# The per-GPU dict, declared once: NVML readings, `parse_gpu_section` of `nvidia-smi -q` and the
# snapshot loader all produce it (docs/parse.md), so one set of judges serves every source.
_ECC_COUNTS = Record(
    dict.fromkeys(
        (
            "correctable",
            "uncorrectable",
            "sram_correctable",
            "sram_uncorrectable",
            "dram_correctable",
            "dram_uncorrectable",
        ),
        int,
    )
)
_MODE_PAIR = Record({"current": bool, "pending": bool})
_PROCESS = Record(
    {
        "pid": int,
        "type": str,
        "name": str,
        "user": str,
        "used_memory_mib": int,
        "gpu_instance_id": int,
        "compute_instance_id": int,
    }
)
_NVLINK_LINK = Record({"active": bool, "speed_gbps": float, "version": int, "errors": MapOf(int)})
GPU_SHAPE = Record(
    {
        "index": int,
        "bus_id": str,
        "name": str,
        "uuid": str,
        "serial": str,
        "architecture": str,
        "vbios_version": str,
        "minor_number": int,
        "persistence_mode": bool,
        "compute_mode": str,
        "mig_mode": _MODE_PAIR,
        "ecc_mode": _MODE_PAIR,
        "ecc": Record({"volatile": _ECC_COUNTS, "aggregate": _ECC_COUNTS, "sram_threshold_exceeded": bool}),
        "retired_pages": Record({"single_bit": int, "double_bit": int, "pending": bool}),
        "remapped_rows": Record(
            {
                "pending": bool,
                "failure": bool,
                "uncorrectable": int,
                "correctable": int,
                "banks_max": int,
                "banks_none": int,
            }
        ),
        "pcie": Record(
            dict.fromkeys(
                (
                    "gen_current",
                    "gen_max",
                    "gen_device_max",
                    "gen_host_max",
                    "width_current",
                    "width_max",
                    "replays",
                    "replay_rollovers",
                ),
                int,
            )
        ),
        "throttle_reasons": MapOf(bool),
        "temperature": Record(
            dict.fromkeys(
                (
                    "gpu_c",
                    "memory_c",
                    "slowdown_c",
                    "shutdown_c",
                    "max_operating_c",
                    "t_limit_c",
                    "slowdown_t_limit_c",
                    "shutdown_t_limit_c",
                ),
                int,
            )
        ),
        "power": Record(
            dict.fromkeys(
                (
                    "draw_w",
                    "limit_w",
                    "default_limit_w",
                    "max_limit_w",
                    "requested_limit_w",
                    "module_limit_w",
                ),
                float,
            )
        ),
        # MiB: 0 to 1 PiB (an H200 has 141 GiB). Below zero or beyond that, the file is damaged.
        "memory": Record(dict.fromkeys(("total_mib", "used_mib", "free_mib"), InRange(0, 2**30))),
        "utilization": Record({"gpu_percent": int, "memory_percent": int}),
        "fabric": Record({"state": str, "status": str}),
        "reset_required": bool,
        "drain_and_reset_recommended": bool,
        "recovery_action": str,  # one of parsers.nvidia_smi.RECOVERY_ACTIONS
        "processes": ListOf(_PROCESS),  # None: unknown; []: none running
        "nvlink": Nullable(Record({"links": MapOf(_NVLINK_LINK)})),  # None on PCIe-only GPUs
        "lost": bool,
        "error": str,
        "errors": MapOf(str),  # reading -> why it failed
    },
    defaults={"lost": False, "errors": {}, "throttle_reasons": {}},
)
# `nvidia-smi topo -p2p` as parsed by ddpdoctor.parsers.nvidia_smi_topo.parse_topo_p2p.
P2P_SHAPE = Nullable(Record({"gpus": ListOf(str), "matrix": MapOf(MapOf(str)), "legend": MapOf(str)}))
NVML_SHAPE = Record(
    {
        "available": bool,
        "error": Nullable(Record({"kind": str, "message": str})),
        "driver_version": str,
        "cuda_driver_version": str,
        "nvml_version": str,
        "device_count": InRange(0, 4096),
        "gpus": ListOf(GPU_SHAPE),
        "p2p": P2P_SHAPE,
    },
    defaults={"available": False, "gpus": []},
)


# What a replayed nvml.json must not hold, checked strictly at the edge (the rest is conformed leniently
# by load_nvml_fact): readings that cannot be. A file with them is refused as a bad snapshot file, so
# `check` reports it and `plan` does not size a model against -79.6 GiB. Absent and null still fit.
_MIB = Loose(InRange(0, 2**30))
NVML_IMPOSSIBLE = Record(
    {
        "device_count": Loose(InRange(0, 4096)),
        "gpus": Loose(
            ListOf(Loose(Record({"memory": Loose(Record(dict.fromkeys(("total_mib", "used_mib", "free_mib"), _MIB)))})))
        ),
    }
)


def empty_gpu(index: int) -> dict[str, Any]:
    """A per-GPU dict with every field unknown (the shape of parsers.nvidia_smi.parse_gpu_section)."""
    return conform({"index": index}, GPU_SHAPE)


def load_nvml_fact(value: Any) -> Optional[dict[str, Any]]:
    """The `nvml` fact (live, or read back from a snapshot's nvml.json) in the shape of `gather_nvml`.

    Wrong-typed values become None; a GPU without an index gets its position. None when the value is
    not an object at all (then the nvidia-smi fallback is used, as when the fact is absent).
    """
    out = conform_fact(value, NVML_SHAPE)
    if out is None:
        return None
    for position, gpu in enumerate(out["gpus"]):
        if gpu["index"] is None:
            gpu["index"] = position
    return out


def read_gpu(lib: Any, index: int) -> tuple[dict[str, Any], Any]:
    """Every reading of GPU `index`, and its handle (None when it could not be opened).

    Equivalent: nvidia-smi -q -i INDEX.
    """
    gpu = empty_gpu(index)
    r = NvmlReader(lib)
    handle = None
    try:
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001
            # nvidia-smi's "Unable to determine the device handle for GPU ...: Unknown Error" is this
            # call failing: the GPU is unreachable, whatever the code says.
            raise GpuLost(f"nvmlDeviceGetHandleByIndex({index}): {exc}") from None
        q = r.query
        gpu["name"] = _text(q("name", "nvmlDeviceGetName", handle))
        gpu["uuid"] = _text(q("uuid", "nvmlDeviceGetUUID", handle))
        pci = q("bus_id", "nvmlDeviceGetPciInfo", handle)
        gpu["bus_id"] = _text(getattr(pci, "busId", None)) if pci is not None else None
        gpu["serial"] = _text(q("serial", "nvmlDeviceGetSerial", handle))
        gpu["vbios_version"] = _text(q("vbios_version", "nvmlDeviceGetVbiosVersion", handle))
        arch = q("architecture", "nvmlDeviceGetArchitecture", handle)
        if isinstance(arch, int) and not isinstance(arch, bool):
            gpu["architecture"] = ARCHITECTURES.get(arch) or (None if arch == 0xFFFFFFFF else f"arch {arch}")
        gpu["minor_number"] = q("minor_number", "nvmlDeviceGetMinorNumber", handle)
        gpu["persistence_mode"] = _bool(q("persistence_mode", "nvmlDeviceGetPersistenceMode", handle))
        mode = q("compute_mode", "nvmlDeviceGetComputeMode", handle)
        gpu["compute_mode"] = COMPUTE_MODES.get(mode, f"mode {mode}") if mode is not None else None
        gpu["mig_mode"] = _pair(q("mig_mode", "nvmlDeviceGetMigMode", handle))
        gpu["ecc_mode"] = _pair(q("ecc_mode", "nvmlDeviceGetEccMode", handle))
        if gpu["ecc_mode"]["current"] is not False:
            gpu["ecc"]["volatile"] = _ecc(r, handle, 0, "volatile")
            gpu["ecc"]["aggregate"] = _ecc(r, handle, 1, "aggregate")
        single = q("retired_pages.single_bit", "nvmlDeviceGetRetiredPages", handle, 0)
        double = q("retired_pages.double_bit", "nvmlDeviceGetRetiredPages", handle, 1)
        pending = q("retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle)
        gpu["retired_pages"] = {
            "single_bit": len(single) if single is not None else None,
            "double_bit": len(double) if double is not None else None,
            "pending": _bool(pending),
        }
        rows = q("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        if isinstance(rows, (list, tuple)) and len(rows) >= 4:
            hist = q("remapped_rows.histogram", "nvmlDeviceGetRowRemapperHistogram", handle)
            gpu["remapped_rows"] = {
                "correctable": rows[0],
                "uncorrectable": rows[1],
                "pending": bool(rows[2]),
                "failure": bool(rows[3]),
                "banks_max": getattr(hist, "max", None),
                "banks_none": getattr(hist, "none", None),
            }
        gen_max = q("pcie.gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
        gen_device_max = q("pcie.gen_device_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration", handle)
        gpu["pcie"] = {
            "gen_current": q("pcie.gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "gen_max": gen_max,
            "gen_device_max": gen_device_max,
            # NVML has no host-side call: its "max" is the lower of the GPU's and the slot's, so a max
            # below the GPU's own is the slot's limit. Otherwise the host is at least as fast: unknown.
            "gen_host_max": gen_max
            if isinstance(gen_max, int) and isinstance(gen_device_max, int) and gen_max < gen_device_max
            else None,
            "width_current": q("pcie.width_current", "nvmlDeviceGetCurrPcieLinkWidth", handle),
            "width_max": q("pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth", handle),
            "replays": q("pcie.replays", "nvmlDeviceGetPcieReplayCounter", handle),
            "replay_rollovers": None,
        }
        reasons = q("throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = q("throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if isinstance(reasons, int):
            gpu["throttle_reasons"] = {name: bool(reasons & bit) for name, bit in CLOCK_EVENT_BITS.items()}
        gpu["temperature"].update(
            {
                "gpu_c": q("temperature.gpu", "nvmlDeviceGetTemperature", handle, 0),
                "shutdown_c": q("temperature.shutdown", "nvmlDeviceGetTemperatureThreshold", handle, 0),
                "slowdown_c": q("temperature.slowdown", "nvmlDeviceGetTemperatureThreshold", handle, 1),
                "max_operating_c": q(
                    "temperature.max_operating", "nvmlDeviceGetTemperatureThreshold", handle, 3
                ),
            }
        )
        constraints = q("power.constraints", "nvmlDeviceGetPowerManagementLimitConstraints", handle)
        gpu["power"] = {
            "draw_w": _watts(q("power.draw", "nvmlDeviceGetPowerUsage", handle)),
            "limit_w": _watts(q("power.limit", "nvmlDeviceGetEnforcedPowerLimit", handle)),
            "default_limit_w": _watts(
                q("power.default_limit", "nvmlDeviceGetPowerManagementDefaultLimit", handle)
            ),
            "max_limit_w": _watts(constraints[1])
            if isinstance(constraints, (list, tuple)) and len(constraints) > 1
            else None,
            "requested_limit_w": _watts(
                q("power.requested_limit", "nvmlDeviceGetPowerManagementLimit", handle)
            ),
            "module_limit_w": _watts(
                _field_value(r, "power.module_limit", handle, FI_POWER_CURRENT_LIMIT, POWER_SCOPE_MODULE)
            ),
        }
        mem = q("memory", "nvmlDeviceGetMemoryInfo", handle)
        if mem is not None:
            gpu["memory"] = {
                "total_mib": _mib(getattr(mem, "total", None)),
                "used_mib": _mib(getattr(mem, "used", None)),
                "free_mib": _mib(getattr(mem, "free", None)),
            }
        util = q("utilization", "nvmlDeviceGetUtilizationRates", handle)
        if util is not None:
            gpu["utilization"] = {
                "gpu_percent": getattr(util, "gpu", None),
                "memory_percent": getattr(util, "memory", None),
            }
        gpu["fabric"] = _fabric(r, handle)
        gpu.update(_recovery(r, handle))
        gpu["processes"] = _processes(r, handle)
        gpu["nvlink"] = _nvlink(r, handle)
    except GpuLost as exc:
        gpu["lost"] = True
        gpu["error"] = str(exc)
        handle = None
    gpu["errors"] = dict(r.errors)
    return gpu, handle


def read_p2p(lib: Any, handles: list[Any]) -> Optional[dict[str, Any]]:
    """Peer-to-peer read capability between GPU pairs, in the shape of `parse_topo_p2p`.

    Equivalent: nvidia-smi topo -p2p r.
    """
    names = [f"GPU{i}" for i in range(len(handles))]
    matrix: dict[str, dict[str, str]] = {n: {n: "X"} for n in names}
    r = NvmlReader(lib)
    seen = False
    for i, hi in enumerate(handles):
        for j, hj in enumerate(handles):
            if i == j or hi is None or hj is None:
                continue
            try:
                status = r.query(f"p2p.{i}.{j}", "nvmlDeviceGetP2PStatus", hi, hj, 0)
            except GpuLost:
                continue
            if status is None:
                continue
            seen = True
            matrix[names[i]][names[j]] = P2P_STATUS.get(int(status), "U")
    return {"gpus": names, "matrix": matrix, "legend": {}} if seen else None


def _load_bindings() -> Any:
    return importlib.import_module("pynvml")


def gather_nvml(lib: Any = None) -> dict[str, Any]:
    """Driver, CUDA driver version and every GPU's readings, as plain JSON-able data; never raises.

    Equivalent: nvidia-smi -q; nvidia-smi topo -p2p r. `lib` replaces the pynvml module (tests pass a
    fake one at this boundary).
    """
    out: dict[str, Any] = {
        "available": False,
        "error": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "device_count": None,
        "gpus": [],
        "p2p": None,
    }
    with _LOCK:
        if lib is None:
            try:
                lib = _load_bindings()
            except ImportError as exc:
                out["error"] = {"kind": "bindings_missing", "message": f"cannot import pynvml: {exc}"}
                return out
        try:
            lib.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - init failures are findings, not tracebacks
            out["error"] = {"kind": classify_error(exc), "message": f"nvmlInit: {exc}"}
            return out
        try:
            out["available"] = True
            r = NvmlReader(lib)
            try:
                out["driver_version"] = _text(r.query("driver_version", "nvmlSystemGetDriverVersion"))
                out["nvml_version"] = _text(r.query("nvml_version", "nvmlSystemGetNVMLVersion"))
                cuda = r.query("cuda_driver_version", "nvmlSystemGetCudaDriverVersion_v2")
                if cuda is None:
                    cuda = r.query("cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
                if isinstance(cuda, int) and cuda > 0:
                    out["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
                count = r.query("device_count", "nvmlDeviceGetCount")
            except GpuLost as exc:
                out["error"] = {"kind": "lost", "message": str(exc)}
                count = None
            out["device_count"] = count
            if r.errors and count is None:
                out["error"] = {"kind": "error", "message": "; ".join(r.errors.values())}
            handles = []
            for index in range(count or 0):
                gpu, handle = read_gpu(lib, index)
                out["gpus"].append(gpu)
                handles.append(handle)
            if len(handles) > 1:
                out["p2p"] = read_p2p(lib, handles)
        finally:
            _shutdown(lib)
    return out


NVML_CLOCK_MEM = 2  # nvmlClockType_t


def read_memory_specs(indices: Optional[list[int]] = None, lib: Any = None) -> list[dict[str, Any]]:
    """Name, memory bus width (bits), maximum memory clock (MHz) and free memory (bytes) of GPUs
    `indices` (all when None), for bench-nccl's memory-bandwidth ceiling and its buffer-size preflight; never raises ([] when NVML is unusable, None per missing
    reading). Equivalent: nvidia-smi --query-gpu=name,clocks.max.memory --format=csv (no CLI field
    gives the bus width)."""
    out: list[dict[str, Any]] = []
    with _LOCK:
        try:
            lib = lib if lib is not None else _load_bindings()
            lib.nvmlInit()
        except Exception:  # noqa: BLE001 - no NVML: the caller falls back to its datasheet table
            return out
        try:
            r = NvmlReader(lib)
            try:
                count = r.query("device_count", "nvmlDeviceGetCount")
            except GpuLost:
                count = None
            for index in indices if indices is not None else range(count or 0):
                spec: dict[str, Any] = {
                    "index": index,
                    "name": None,
                    "bus_width_bits": None,
                    "max_memory_clock_mhz": None,
                    "free_memory_bytes": None,
                }
                try:
                    handle = r.query("handle", "nvmlDeviceGetHandleByIndex", index)
                    if handle is not None:
                        spec["name"] = _text(r.query("name", "nvmlDeviceGetName", handle))
                        spec["bus_width_bits"] = r.query("bus_width", "nvmlDeviceGetMemoryBusWidth", handle)
                        spec["max_memory_clock_mhz"] = r.query(
                            "max_memory_clock", "nvmlDeviceGetMaxClockInfo", handle, NVML_CLOCK_MEM
                        )
                        mem = r.query("memory", "nvmlDeviceGetMemoryInfo", handle)
                        spec["free_memory_bytes"] = getattr(mem, "free", None)
                except GpuLost:
                    pass  # a lost GPU gets no ceiling; `check` reports it
                out.append(spec)
        finally:
            _shutdown(lib)
    return out
