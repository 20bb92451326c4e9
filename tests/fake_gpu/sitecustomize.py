"""Test-only "GPU present" edge: `pytest --fake-gpu` makes every Python process of the test run (pytest
itself, and through PYTHONPATH the `python -m ddpdoctor` subprocesses the tests start) see the real
one-GPU H100 node of tests/fixtures/gpu/real-h100/ at the I/O edge, on a CPU-only machine.

What is faked, and only this (the edge the product reads GPUs through):
- the command runner (`ddpdoctor.edge.runner.run_argv`): `nvidia-smi ...` and `python -m ddpdoctor.edge.torch_info`
  answer with that node's real outputs (nvidia-smi -q R580, topo -m, empty nvlink -s, torch-info);
  every other command runs for real (torch-info too when run with an environment of its own);
- NVML (`ddpdoctor.edge.nvml.gather_nvml`): that node's nvml.json, unless a test brings its own bindings;
- torch's build metadata (`ddpdoctor.bench.preflight.read_torch_build`): torch 2.11.0+cu130, as there.

torch itself is left alone (torch.cuda.is_available() stays False), so a test that launches NCCL ranks
on this "GPU" fails the way a test that assumes no GPU would pass on a CPU machine and fail on a GPU
node: the point of the run is to find such tests. Not faked: /dev/nvidia* (tests marked `gpu` stay
skipped: they need the real device).

Outputs with no captured counterpart are derived from the captured ones and say so below.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = "DDPDOCTOR_TEST_FAKE_GPU"


def _outputs(node: Path) -> dict[tuple[str, ...], str]:
    q = (node / "nvidia-smi-q.txt").read_text()
    # Derived (not captured): the bench query's one row, from the same node's nvidia-smi -q / nvml.json
    # values (index 0, UUID, name, compute mode Default, PCIe Gen 5 x16, driver 580.159.04).
    gpu = json.loads((node / "nvml.json").read_text())["gpus"][0]
    bench_row = ", ".join(
        [
            "0",
            gpu["uuid"],
            gpu["name"],
            gpu["compute_mode"],
            str(gpu["pcie"]["gen_max"]),
            str(gpu["pcie"]["width_max"]),
            "580.159.04",
        ]
    )
    return {
        ("-q",): q,
        ("topo", "-m"): (node / "nvidia-smi-topo-m.txt").read_text(),
        ("nvlink", "-s"): (node / "nvidia-smi-nvlink-s.txt").read_text(),
        ("nvlink", "-e"): "",  # a GPU without NVLink prints nothing, as for -s
        (): (node / "nvidia-smi-default.txt").read_text(),
        ("bench-gpus",): bench_row + "\n",
        ("apps",): "",  # no compute processes
    }


def install(node: Path) -> None:
    """Patch the edge of this process (call before the modules that bind these names are imported)."""
    from ddpdoctor.bench import preflight
    from ddpdoctor.edge import nvml, runner, sources

    outputs = _outputs(node)
    torch_info = (node / "torch-info.txt").read_text()
    real_run = runner.run_argv

    def fake_run_argv(argv, timeout_s=runner.DEFAULT_TIMEOUT_S, env=None, started=None):  # type: ignore[no-untyped-def]
        argv = tuple(argv)
        if argv and os.path.basename(argv[0]) == "nvidia-smi":
            rest = argv[1:]
            if rest and rest[0].startswith("--query-gpu="):
                key: tuple[str, ...] = ("bench-gpus",)
            elif rest and rest[0].startswith("--query-compute-apps="):
                key = ("apps",)
            else:
                key = rest
            if key in outputs:
                return runner.CommandResult(argv=argv, returncode=0, stdout=outputs[key], duration_s=0.05)
            return runner.CommandResult(
                argv=argv, returncode=2, stderr=f"fake-gpu: no captured output for {' '.join(argv)}"
            )
        # Only the probe as check runs it (its own environment): tests that run it with a fake torch on
        # PYTHONPATH (env given) exercise the probe itself, not the machine.
        if len(argv) >= 3 and argv[1:3] == ("-m", "ddpdoctor.edge.torch_info") and env is None:
            return runner.CommandResult(argv=argv, returncode=0, stdout=torch_info, duration_s=0.05)
        return real_run(argv, timeout_s=timeout_s, env=env, started=started)

    nvml_fact = json.loads((node / "nvml.json").read_text())
    runner.run_argv = fake_run_argv  # type: ignore[assignment]
    sources.run_argv = fake_run_argv  # type: ignore[attr-defined]
    real_gather, real_load = nvml.gather_nvml, nvml._load_bindings

    def fake_gather_nvml(lib=None):  # type: ignore[no-untyped-def]
        # A test that brings its own bindings (a lib, or a patched _load_bindings) is testing NVML reading.
        if lib is not None or nvml._load_bindings is not real_load:
            return real_gather(lib)
        return json.loads(json.dumps(nvml_fact))

    nvml.gather_nvml = fake_gather_nvml  # type: ignore[assignment]
    preflight.read_torch_build = lambda: ("2.11.0+cu130", "13.0")  # type: ignore[assignment]


if os.environ.get(ENV):
    try:
        install(Path(os.environ[ENV]))
    except ImportError as exc:  # ddpdoctor not importable in this interpreter: nothing to fake
        print(f"fake-gpu: not installed ({exc})", file=sys.stderr)
