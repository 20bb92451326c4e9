from __future__ import annotations

import time

from ddpdoctor.core.engine import Area, Context, run_checks, select_areas
from ddpdoctor.core.model import ExitCode, Severity, define
from ddpdoctor.edge.runner import define_command
from ddpdoctor.edge.sources import LiveSources

SLEEPER = define_command("test-sleeper", ("sleep", "1000"), "test only: a tool that hangs")
GOOD = define("test.good", "Good", "test only")


def _hung_collect(ctx: Context):
    return ctx.sources.run(SLEEPER)


def _pure_hang(ctx: Context):
    time.sleep(1000)  # a probe stuck in Python code, not in a command


def _crash(ctx: Context):
    raise RuntimeError("kaboom")


def _ok_collect(ctx: Context):
    return "fine"


def _ok_judge(facts):
    return [GOOD.finding(Severity.OK, facts)]


def test_hung_probes_are_bounded_and_reported() -> None:
    areas = [
        Area("hung", "Hung tool", _hung_collect, lambda r: [GOOD.finding(Severity.OK, "never")]),
        Area("stuck", "Stuck code", _pure_hang, _ok_judge),
        Area("fine", "Fine", _ok_collect, _ok_judge),
    ]
    timeout = 1.0
    start = time.monotonic()
    report = run_checks(LiveSources(), areas, timeout_s=timeout)
    elapsed = time.monotonic() - start
    assert elapsed <= timeout + 1.0
    by_area = {f.area: f for f in report.findings}
    assert by_area["stuck"].id == "core.probe.timeout" and by_area["stuck"].severity == Severity.ERROR
    assert by_area["fine"].severity == Severity.OK
    # The hung command is killed at the deadline; its area either judged the timeout or timed out itself.
    assert by_area["hung"].id in ("core.probe.timeout", "test.good")
    assert report.exit_code() == ExitCode.INCONCLUSIVE


def test_crashing_probe_is_an_error_finding() -> None:
    report = run_checks(LiveSources(), [Area("boom", "Boom", _crash, _ok_judge)], timeout_s=5)
    (f,) = report.findings
    assert f.id == "core.probe.crashed" and f.severity == Severity.ERROR and f.area == "boom"
    assert "kaboom" in f.summary


def test_exit_codes() -> None:
    from ddpdoctor.core.model import exit_code_for

    fail = GOOD.finding(Severity.FAIL, "x")
    warn = GOOD.finding(Severity.WARN, "x")
    err = GOOD.finding(Severity.ERROR, "x")
    assert exit_code_for([]) == ExitCode.HEALTHY
    assert exit_code_for([warn]) == ExitCode.HEALTHY
    assert exit_code_for([warn], strict=True) == ExitCode.FAILED
    assert exit_code_for([err, warn]) == ExitCode.INCONCLUSIVE
    assert exit_code_for([err, fail]) == ExitCode.FAILED


def test_select_areas_rejects_unknown_names() -> None:
    areas = [Area("a", "A", _ok_collect, _ok_judge), Area("b", "B", _ok_collect, _ok_judge)]
    assert [a.name for a in select_areas(areas, only=["b"])] == ["b"]
    assert [a.name for a in select_areas(areas, skip=["b"])] == ["a"]
    try:
        select_areas(areas, only=["nope"])
    except ValueError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("unknown area accepted")
