"""`python -m ddpdoctor.edge.torch_info`: what this Python's torch can do, as one JSON object on stdout.

It runs in a subprocess of `ddpdoctor check` (with a timeout), so a missing, broken or hanging torch
is a finding there and never a crash of the checker. Only the standard library is imported at module
level; torch is imported inside `gather()` and every query is guarded: one failing query is recorded
under "errors" and the others still run.

Equivalent: python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"
"""

from __future__ import annotations

import glob
import json
import multiprocessing
import os
import platform
import sys
import traceback
import warnings
from typing import Any, Callable

SCHEMA = "ddpdoctor.edge.torch_info/1"


def _nccl_version_text(raw: Any) -> str | None:
    """torch.cuda.nccl.version(): a tuple (2, 21, 5) in recent torch, an int (2708 or 21905) in old ones."""
    if raw is None:
        return None
    if isinstance(raw, (tuple, list)):
        return ".".join(str(x) for x in raw)
    if isinstance(raw, int):
        # NCCL_VERSION_CODE: major*1000+minor*100+patch before 2.9, major*10000+minor*100+patch since.
        if raw >= 10000:
            return f"{raw // 10000}.{raw % 10000 // 100}.{raw % 100}"
        return f"{raw // 1000}.{raw % 1000 // 100}.{raw % 100}"
    return str(raw)


def _guarded(errors: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None with the exception text kept under errors[key]; CUDA warnings are kept too."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - a broken torch must give data, not a traceback
            errors[key] = f"{type(exc).__name__}: {exc}"
            value = None
    for w in caught:
        text = str(w.message).strip()
        if text and ("CUDA" in text or "NVIDIA" in text or "driver" in text):
            errors.setdefault(f"{key}.warning", text.splitlines()[0][:500])
    return value


def _python_facts() -> dict[str, Any]:
    try:
        start_method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_start_method()
        methods = multiprocessing.get_all_start_methods()
    except Exception as exc:  # noqa: BLE001
        start_method, methods = None, [f"error: {exc}"]
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": sys.platform,
        "mp_start_method": start_method,
        "mp_start_methods": methods,
        # Where CUDA could be present even if torch cannot use it (CPU wheel on a GPU node).
        "nvidia_device_files": sorted(glob.glob("/dev/nvidia[0-9]*")),
        "nvidiactl": os.path.exists("/dev/nvidiactl"),
    }


def _torch_facts(torch: Any, errors: dict[str, str]) -> dict[str, Any]:
    version = getattr(torch, "version", None)
    facts: dict[str, Any] = {
        "version": getattr(torch, "__version__", None),
        "path": os.path.dirname(getattr(torch, "__file__", "") or ""),
        "git_version": getattr(version, "git_version", None),
        "cuda": getattr(version, "cuda", None),
        "hip": getattr(version, "hip", None),
        "debug": getattr(version, "debug", None),
    }
    facts["cudnn"] = _guarded(errors, "cudnn", lambda: torch.backends.cudnn.version())
    facts["nccl"] = None
    if facts["cuda"] or facts["hip"]:
        facts["nccl"] = _nccl_version_text(_guarded(errors, "nccl", lambda: torch.cuda.nccl.version()))
    dist = _guarded(errors, "distributed", lambda: __import__("torch.distributed").distributed)
    available = bool(dist is not None and _guarded(errors, "distributed", dist.is_available))
    backends: dict[str, Any] = {"distributed": available}
    for name in ("nccl", "gloo", "mpi", "ucc"):
        fn = getattr(dist, f"is_{name}_available", None) if available else None
        backends[name] = bool(_guarded(errors, f"backend.{name}", fn)) if fn is not None else False
    facts["backends"] = backends
    facts["cuda_available"] = bool(_guarded(errors, "cuda_available", torch.cuda.is_available))
    facts["device_count"] = _guarded(errors, "device_count", torch.cuda.device_count)
    facts["arch_list"] = (
        _guarded(errors, "arch_list", torch.cuda.get_arch_list) if facts["cuda_available"] else []
    )
    return facts


def gather() -> dict[str, Any]:
    """Everything above, as a JSON-able dict; torch import failures are data ("import_error")."""
    info: dict[str, Any] = {"schema": SCHEMA}
    info.update(_python_facts())
    errors: dict[str, str] = {}
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 - ImportError, OSError from a missing .so, SystemExit...
        info["torch"] = None
        tb = traceback.format_exception_only(type(exc), exc)
        info["import_error"] = "".join(tb).strip()[-2000:]
        info["errors"] = errors
        return info
    info["torch"] = _torch_facts(torch, errors)
    info["errors"] = errors
    return info


def main() -> int:
    # Libraries may print to fd 1 while loading; keep stdout for the JSON alone.
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        info = gather()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    sys.stdout.write(json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
