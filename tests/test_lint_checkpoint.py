"""DDP047 against the truth: the checkpoint shape the rule reports is saved and loaded with the installed torch
(2.13 here), the way the program's resume does; the load fails exactly where the rule says it will, and the
rule's fixes load."""

from __future__ import annotations

import argparse
import pickle
import textwrap
from pathlib import Path

import pytest
import torch

from ddpdoctor.lint.engine import lint_source
from ddpdoctor.lint.ruleset import all_rules, default_rules

RESUME = """
import argparse
import torch
import torch.distributed as dist

def save(args, model):
    torch.save({{"model": model.state_dict(), "epoch": 1, "args": {saved}}}, "checkpoint.pth")

def resume(args, model):
    dist.init_process_group("nccl")
    checkpoint = torch.load("checkpoint.pth", map_location="cpu"{extra})
    model.load_state_dict(checkpoint["model"])
    return checkpoint["args"]

args = argparse.ArgumentParser().parse_args()
"""


def _codes(saved: str, extra: str = "") -> list[str]:
    src = textwrap.dedent(RESUME.format(saved=saved, extra=extra))
    return [d.code for d in lint_source(src, "train.py", [all_rules()["DDP047"]]) if d.code == "DDP047"]


def test_ddp047_is_opinionated() -> None:
    # Held-out lint corpora 11-14: all 9 findings judged a one-process version incompatibility, not a
    # multi-process bug; it runs when selected.
    assert "DDP047" not in {r.id for r in default_rules()}


def test_the_reported_checkpoint_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "epoch": 1, "args": argparse.Namespace(lr=0.1)}, path)
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 6):
        pytest.skip("weights_only=True is the default from PyTorch 2.6 on")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, map_location="cpu")
    assert _codes("args") == ["DDP047"]


def test_the_fixes_load(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pth"
    args = argparse.Namespace(lr=0.1)
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "epoch": 1, "args": vars(args)}, path)
    assert torch.load(path, map_location="cpu")["args"] == {"lr": 0.1}
    assert _codes("vars(args)") == []
    torch.save({"model": torch.nn.Linear(2, 2).state_dict(), "epoch": 1, "args": args}, path)
    assert torch.load(path, map_location="cpu", weights_only=False)["args"] == args
    assert _codes("args", extra=", weights_only=False") == []
