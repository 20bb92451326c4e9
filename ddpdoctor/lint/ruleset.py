"""Every lint rule, registered: importing the rule modules registers them (registry.py); the engine and
the CLI read RULES from here so that no rule is missed whichever module was imported first."""

from __future__ import annotations

from ddpdoctor.lint import (  # noqa: F401 - registers them
    checkpoint_rules,
    data_rules,
    device_rules,
    early_exit_rules,
    every_rank_rules,
    fatal_rules,
    metric_rules,
    rank_rules,
    rules,
    step_rules,
    world_rules,
    wrapper_rules,
)
from ddpdoctor.lint.registry import RULES, Rule, all_rules, default_rules

__all__ = ["RULES", "Rule", "all_rules", "default_rules"]
