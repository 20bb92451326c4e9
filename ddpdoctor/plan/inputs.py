"""The I/O edge of `plan`: the config file (bounded, parsed as data only) and this node's GPUs.

A config.json is read as JSON and nothing else: no model code is imported or run, whatever
`auto_map` or `architectures` it names.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ddpdoctor.checks.gpu.models import gpu_generation
from ddpdoctor.edge.files import (
    InputRefused,
    check_nesting,
    is_regular_file,
    load_json_text,
    read_stdin_bytes,
    read_user_bytes,
    read_user_head,
    refusal_text,
    shown_path,
    user_path_mode,
)
from ddpdoctor.plan.judge import Hardware
from ddpdoctor.plan.shape import ModelShape, shape_from_config

if TYPE_CHECKING:
    from ddpdoctor.edge.sources import Sources

# Hugging Face config.json files are a few KiB; the largest (label maps, quantization tables) stay
# well under a MiB. Anything bigger is not a config.
MAX_CONFIG_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32


class PlanInputError(ValueError):
    """A file or value the user gave that plan cannot use (a usage error, exit 2)."""


_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def hub_cache_dir(env: Optional[dict[str, str]] = None) -> Path:
    """Where huggingface_hub keeps downloaded models: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub (huggingface_hub's constants)."""
    env = dict(os.environ) if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def resolve_config(text: str, env: Optional[dict[str, str]] = None) -> Path:
    """The config.json that `--config` names: a file, a model directory (its config.json), or a model
    name (`org/name`) already in the local Hugging Face cache (the snapshot refs/main points to, else the
    newest). Nothing is downloaded. PlanInputError when none is found."""
    path = Path(text)
    try:
        mode = user_path_mode(path)
    except InputRefused as exc:
        raise PlanInputError(refusal_text(exc)) from None
    if mode is not None and stat.S_ISDIR(mode):
        return path / "config.json"
    if mode is not None or not _HUB_NAME.match(text):
        return path
    repo = hub_cache_dir(env) / ("models--" + text.replace("/", "--"))
    snapshots = repo / "snapshots"
    candidates: list[Path] = []
    try:
        # The bounded reader: refs/main may be a FIFO or a device in a cache someone else filled.
        ref = read_user_head(repo / "refs" / "main", 128).decode("ascii", errors="replace").strip()
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            candidates.append(snapshots / ref / "config.json")
    except (OSError, ValueError):
        pass  # no refs/main: a cache filled by snapshot_download(revision=...) or copied by hand
    try:
        found = [p / "config.json" for p in snapshots.iterdir() if is_regular_file(p / "config.json")]
        candidates += sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    except (OSError, ValueError):
        pass
    for candidate in candidates:
        if is_regular_file(candidate):
            return candidate
    raise PlanInputError(
        f"{text}: no such file, and no {text} in the Hugging Face cache ({hub_cache_dir(env)}); plan never "
        "downloads: give the config.json path or run `huggingface-cli download "
        f"{text} config.json` first"
    )


def read_config(path: Path) -> dict[str, Any]:
    """The JSON object in `path` (`-`: standard input), read through the bounded edge reader.
    PlanInputError for anything else."""
    try:
        if str(path) == "-":
            data = read_stdin_bytes(MAX_CONFIG_BYTES)
        else:
            data = read_user_bytes(path, MAX_CONFIG_BYTES)
    except InputRefused as exc:
        if exc.errno == errno.EFBIG:
            raise PlanInputError(
                f"{path}: larger than {MAX_CONFIG_BYTES // 1024} KiB: not a model config"
            ) from None
        raise PlanInputError(refusal_text(exc)) from None  # a FIFO, device, directory
    except (OSError, ValueError) as exc:
        raise PlanInputError(f"{shown_path(path)}: cannot open: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        # Decoded strictly first: json.loads on bytes would guess UTF-16 from a byte-order mark.
        # utf-8-sig: a byte-order mark (Windows editors write one) is skipped, not an error.
        value = load_json_text(data.decode("utf-8-sig"))
        if isinstance(value, dict):
            check_nesting(value, MAX_JSON_DEPTH)
    except UnicodeDecodeError:
        raise PlanInputError(f"{path}: not UTF-8 text: not a config.json") from None
    except ValueError as exc:
        if "nested" in str(exc):
            raise PlanInputError(
                f"{path}: nested deeper than {MAX_JSON_DEPTH} levels: not a model config"
            ) from None
        raise PlanInputError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise PlanInputError(f"{path}: a config.json holds a JSON object, this holds {type(value).__name__}")
    return value


def load_shape(path: Path) -> ModelShape:
    """Read and count a config (a file, a model directory, a cached model name or `-`); PlanInputError
    for an unreadable or uncountable one."""
    if str(path) != "-":
        path = resolve_config(str(path))
    cfg = read_config(path)
    try:
        return shape_from_config(cfg)
    except ValueError as exc:
        raise PlanInputError(f"{path}: {exc}") from None


def read_hardware(
    sources: Optional[Sources],
    gpus: Optional[int],
    nodes: int,
    gpu_mem: Optional[int],
    source_label: str,
    gpu_name: Optional[str] = None,
) -> Hardware:
    """The GPUs to plan for: flags first, then what NVML (or the snapshot) says about this node.

    `--gpus` without `--gpu-mem` takes the memory of the node's GPUs when there are any. Equivalent:
    nvidia-smi --query-gpu=name,memory.total --format=csv.
    """
    facts = None
    if sources is not None:
        from ddpdoctor.checks.gpu import read_gpu_facts

        facts = read_gpu_facts(sources)
    found = [g for g in (facts.gpus if facts else ()) if not g.lost and g.memory_total_mib]
    name = found[0].name if found else None
    if gpu_mem is not None:
        count = gpus or (len(found) if found else 1)
        if gpu_name is not None:  # --gpu NAME: that board, whatever this node has
            return Hardware(count, nodes, gpu_mem, gpu_name, gpu_generation(gpu_name), "--gpu")
        return Hardware(count, nodes, gpu_mem, name, gpu_generation(name), "--gpu-mem")
    if found:
        smallest = min(found, key=lambda g: g.memory_total_mib or 0)
        count = gpus or len(found)
        names = sorted({g.name for g in found if g.name})
        notes = []
        if len(names) > 1:
            notes.append(f"GPUs differ ({', '.join(names)}): planned for the smallest")
        if gpus and gpus != len(found):
            notes.append(f"planned for --gpus {gpus} per node; {source_label} has {len(found)}")
        note = "; ".join(notes) or None
        return Hardware(
            count,
            nodes,
            (smallest.memory_total_mib or 0) * 1024 * 1024,
            smallest.name,
            gpu_generation(smallest.name),
            source_label if facts is None else f"{source_label} ({facts.source})",
            note,
        )
    why = "no GPU memory found"
    if facts is not None and facts.error:
        why += f" ({facts.error})"
    elif facts is not None:
        why += f" ({source_label}: no NVIDIA GPU)"
    return Hardware(gpus or 1, nodes, None, None, "unknown", "none", why)
