"""The lint rule registry: what a rule is, `@rule(...)` to declare one, and the registered rules.

Rule modules (rules, device_rules, rank_rules, world_rules, every_rank_rules) register themselves on import; ruleset.py
imports them all, and everything that runs rules reads them from there."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable, Iterable, Union

from ddpdoctor.lint.facts import ModuleFacts

# What a rule yields: the node to report at, or (node, a message more specific than the default).
Hit = Union[ast.AST, "tuple[ast.AST, str]"]


@dataclass(frozen=True)
class Rule:
    """A lint rule: stable id, short name, default message, one-line fix, why it matters, the check."""

    id: str
    name: str
    message: str
    fix: str
    why: str
    check: Callable[[ModuleFacts], Iterable[Hit]]
    # The default tier reports likely bugs only; opinionated rules (timeouts, cleanup, style) run when
    # selected (--select / --extend-select / [tool.ddpdoctor.lint]).
    default: bool = True


RULES: dict[str, Rule] = {}


def rule(id: str, name: str, message: str, fix: str, why: str, default: bool = True) -> Callable:
    """Register a rule function under a stable id."""

    def register(fn: Callable[[ModuleFacts], Iterable[Hit]]) -> Callable[[ModuleFacts], Iterable[Hit]]:
        if id in RULES:
            raise ValueError(f"rule {id} declared twice")
        RULES[id] = Rule(id=id, name=name, message=message, fix=fix, why=why, check=fn, default=default)
        return fn

    return register


def default_rules() -> list[Rule]:
    """The rules a plain `ddpdoctor lint` runs: those that report likely bugs."""
    return [r for r in RULES.values() if r.default]


def all_rules() -> dict[str, Rule]:
    return dict(RULES)
