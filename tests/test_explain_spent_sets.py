"""Every spent held-out explain set from 5 on, log by log: each log in tests/fixtures/explain/spent-setN has an
expectation in test_explain_spent_setN.EXPECTED (root cause id or None, lead id or None, exit code), and explain
gives exactly that. The per-set modules keep the expectations, their provenance and the set's own tests."""

from __future__ import annotations

from types import ModuleType

import pytest
import test_explain_spent_set5
import test_explain_spent_set6
import test_explain_spent_set7
import test_explain_spent_set8
import test_explain_spent_set9
import test_explain_spent_set10
import test_explain_spent_set11
import test_explain_spent_set12
import test_explain_spent_set13
import test_explain_spent_set14
import test_explain_spent_set15
import test_explain_spent_set16
from test_explain_spent_set3 import assert_explained

SETS: dict[str, ModuleType] = {
    f"set{m.__name__.rsplit('set', 1)[1]}": m
    for m in (test_explain_spent_set5, test_explain_spent_set6, test_explain_spent_set7, test_explain_spent_set8,
              test_explain_spent_set9, test_explain_spent_set10, test_explain_spent_set11, test_explain_spent_set12,
              test_explain_spent_set13, test_explain_spent_set14,
              test_explain_spent_set15, test_explain_spent_set16)
}


@pytest.mark.parametrize("spent", sorted(SETS))
def test_every_spent_log_has_an_expectation(spent: str) -> None:
    module = SETS[spent]
    assert sorted(p.stem for p in module.SPENT.glob("*.log")) == sorted(module.EXPECTED)


@pytest.mark.parametrize(
    ("spent", "name"), [(spent, name) for spent in sorted(SETS) for name in sorted(SETS[spent].EXPECTED)]
)
def test_spent_log_is_explained(spent: str, name: str) -> None:
    module = SETS[spent]
    assert_explained(module.SPENT / f"{name}.log", *module.EXPECTED[name])
