"""`ddpdoctor plan`: per-GPU memory of a training step under each parallel strategy, and a verdict.

Modules: `units` (7B, 80GiB), `shape` (parameter counting from a config), `memory` (the formulas, item
by item), `judge` (verdicts, cheapest strategy, what to change) are pure; `inputs` is the I/O edge
(config file, this node's GPUs). No torch import anywhere here.
"""

from __future__ import annotations

from ddpdoctor.checks.gpu.models import gpu_generation
from ddpdoctor.plan.inputs import PlanInputError, load_shape, read_config, read_hardware
from ddpdoctor.plan.judge import Hardware, Plan, Row, make_plan, parse_strategy
from ddpdoctor.plan.memory import Breakdown, Strategy, Workload, breakdown
from ddpdoctor.plan.shape import ModelShape, estimate_shape, shape_from_config
from ddpdoctor.plan.units import parse_bytes, parse_count

__all__ = [
    "Breakdown",
    "Hardware",
    "ModelShape",
    "Plan",
    "PlanInputError",
    "Row",
    "Strategy",
    "Workload",
    "breakdown",
    "estimate_shape",
    "gpu_generation",
    "load_shape",
    "make_plan",
    "parse_bytes",
    "parse_count",
    "parse_strategy",
    "read_config",
    "read_hardware",
    "shape_from_config",
]
