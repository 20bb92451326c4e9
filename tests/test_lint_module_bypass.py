"""DDP054's claim, measured: with real torch.distributed (gloo, two ranks under torchrun on 127.0.0.1), a loss
computed through `ddp_model.module` leaves each rank's gradients its own, while the wrapper all-reduces them;
and the linter flags the script that goes around the wrapper, not the one that goes through it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.lint import lint_source, select_rules

pytest.importorskip("torch")
JOB = Path(__file__).with_name("_module_bypass_job.py")


def _run(mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1",
         "--max-restarts", "0", str(JOB), mode],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize(("mode", "equal"), [("wrapper", True), ("module", False)])
def test_gradients_are_all_reduced_only_through_the_wrapper(mode: str, equal: bool) -> None:
    assert f"{mode} equal={equal}" in _run(mode)


def test_linter_flags_the_job_that_goes_around_the_wrapper() -> None:
    source = JOB.read_text()
    assert [d.code for d in lint_source(source, "job.py", select_rules(["DDP054"]))] == []  # no loop: one step
    looped = source.replace(
        '    loss = (model.module(x) if mode == "module" else model(x)).sum()\n    loss.backward()\n',
        '    for _ in range(3):\n        loss = model.module(x).sum()\n        loss.backward()\n',
    )
    assert looped != source
    hits = lint_source(looped, "job.py", select_rules(["DDP054"]))
    assert [d.code for d in hits] == ["DDP054"]
    through = looped.replace("model.module(x)", "model(x)")
    assert lint_source(through, "job.py", select_rules(["DDP054"])) == []
