"""Precision and recall of `ddpdoctor lint` on the fixture corpus (tests/fixtures/lint/, see its README)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from ddpdoctor.lint import RULES, lint_file

CORPUS = Path(__file__).parent / "fixtures" / "lint"
SCRIPTS = sorted(CORPUS.glob("*.py"))
_EXPECT_RE = re.compile(r"#\s*expect:\s*(DDP\d{3}(?:\s*,\s*DDP\d{3})*)")


def expected_findings(path: Path) -> set[tuple[str, int, str]]:
    out: set[tuple[str, int, str]] = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = _EXPECT_RE.search(line)
        if m:
            out |= {(path.name, n, code.strip()) for code in m.group(1).split(",")}
    return out


def actual_findings(path: Path) -> set[tuple[str, int, str]]:
    diags, _ = lint_file(path)
    return {(path.name, d.line, d.code) for d in diags}


def score() -> tuple[Counter, Counter, Counter]:
    tp: Counter = Counter()
    fp: Counter = Counter()
    fn: Counter = Counter()
    for path in SCRIPTS:
        want, got = expected_findings(path), actual_findings(path)
        for _, _, code in want & got:
            tp[code] += 1
        for _, _, code in got - want:
            fp[code] += 1
        for _, _, code in want - got:
            fn[code] += 1
    return tp, fp, fn


def format_table(tp: Counter, fp: Counter, fn: Counter) -> str:
    rows = ["rule    name                            TP  FP  FN  precision  recall"]
    for code in sorted(set(RULES) | set(tp) | set(fp) | set(fn)):
        t, f_p, f_n = tp[code], fp[code], fn[code]
        precision = t / (t + f_p) if t + f_p else float("nan")
        recall = t / (t + f_n) if t + f_n else float("nan")
        name = RULES[code].name if code in RULES else "?"
        rows.append(f"{code}  {name:<30} {t:>3} {f_p:>3} {f_n:>3}  {precision:>9.2f}  {recall:>6.2f}")
    t, f_p, f_n = sum(tp.values()), sum(fp.values()), sum(fn.values())
    rows.append(
        f"{'all':<38} {t:>3} {f_p:>3} {f_n:>3}  {t / max(t + f_p, 1):>9.2f}  {t / max(t + f_n, 1):>6.2f}"
    )
    return "\n".join(rows)


def test_corpus_is_realistic_and_varied() -> None:
    assert len(SCRIPTS) >= 12
    clean = [p for p in SCRIPTS if p.stem.endswith("_clean")]
    assert len(clean) >= 4
    for p in clean:
        assert not expected_findings(p), f"{p.name} is named clean but expects findings"
    assert (CORPUS / "README.md").exists()
    # Every rule is exercised by at least one script of the corpus.
    seen = {code for p in SCRIPTS for _, _, code in expected_findings(p)}
    assert seen == set(RULES), sorted(set(RULES) - seen)


def test_precision_and_recall_on_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    tp, fp, fn = score()
    table = format_table(tp, fp, fn)
    with capsys.disabled():
        print("\nddpdoctor lint on tests/fixtures/lint/ (" + str(len(SCRIPTS)) + " scripts)\n" + table)
    assert sum(tp.values()) > 0
    assert not fp, f"false positives: {dict(fp)}\n{table}"
    assert not fn, f"missed findings: {dict(fn)}\n{table}"


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.stem.endswith("_clean")], ids=lambda p: p.name)
def test_clean_scripts_have_no_findings(path: Path) -> None:
    diags, n_lines = lint_file(path)
    assert n_lines > 20
    assert diags == []


@pytest.mark.parametrize("path", [p for p in SCRIPTS if not p.stem.endswith("_clean")], ids=lambda p: p.name)
def test_each_buggy_script_matches_its_expectations(path: Path) -> None:
    assert actual_findings(path) == expected_findings(path)
