"""Every machine format is produced and validated: JUnit parsed as Jenkins/GitLab do, GitHub workflow
commands against their grammar, markdown structure, JSON against the published schemas."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.core.model import Evidence, Finding, Severity
from ddpdoctor.render.formats import (
    PROLOG_LINE_MAX,
    Document,
    escape_github_data,
    escape_github_property,
    md_code_block,
    render_github,
    render_junit,
    render_markdown,
    render_prolog,
)

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "docs" / "schemas"
CI = Path(__file__).parent / "fixtures" / "ci"
HEALTHY = CI / "healthy-cpu-node"
MISMATCHED = CI / "mismatched-gpu-node"
H100 = ROOT / "docs" / "examples" / "8xh100-sxm-ndr400.toml"

# ::command prop=value,prop=value::message  (docs.github.com "Workflow commands for GitHub Actions")
GITHUB_LINE = re.compile(
    r"^::(?P<kind>error|warning|notice)"
    r"(?: (?P<props>[A-Za-z]+=[^,:\r\n]*(?:,[A-Za-z]+=[^,:\r\n]*)*))?"
    r"::(?P<message>[^\r\n]*)$"
)


def unescape_github(text: str) -> str:
    return (
        text.replace("%0D", "\r")
        .replace("%0A", "\n")
        .replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
    )


def nasty(sev: Severity, fid: str, **kw) -> Finding:
    return Finding(
        id=fid,
        severity=sev,
        title=kw.pop("title", f"Title: with, punctuation {sev.label}"),
        summary=kw.pop("summary", "50% of links down:\nline two\r\n<b>&amp;</b> | pipe \x00\x07 ctl"),
        fix=kw.pop("fix", "Run `nvidia-smi -r` (100%: sure)" if sev >= Severity.WARN else ""),
        evidence=(Evidence("nvidia-smi -q", "```\nGPU 0: ERR!\n```"),),
        area=fid.split(".")[0],
        data=kw.pop("data", {}),
    )


FINDINGS = [
    nasty(Severity.FAIL, "gpu.ecc.uncorrectable"),
    nasty(Severity.FAIL, "gpu.ecc.uncorrectable", summary="GPU 3 has 2 uncorrectable errors"),
    nasty(Severity.ERROR, "rdma.probe"),
    nasty(Severity.WARN, "net.hostname.loopback"),
    nasty(Severity.SKIP, "gpu.mig"),
    nasty(Severity.INFO, "system.host"),
    nasty(Severity.OK, "system.shm.size"),
    nasty(
        Severity.FAIL,
        "lint.DDP001",
        data={"location": {"file": "train,v2:final.py", "line": 12, "col": 5}},
    ),
]
DOC = Document(
    command="check", findings=FINDINGS, host="node-1", duration_s=1.5, exit_code=1, meta={"a": "b"}
)


def _junit(strict: bool = False) -> ET.Element:
    return ET.fromstring(render_junit(DOC, strict=strict))


def test_junit_structure_as_jenkins_and_gitlab_read_it() -> None:
    root = _junit()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert {s.get("name") for s in suites} == {
        "ddpdoctor.check.gpu",
        "ddpdoctor.check.rdma",
        "ddpdoctor.check.net",
        "ddpdoctor.check.system",
        "ddpdoctor.check.lint",
    }
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        cases = suite.findall("testcase")
        # One test case per finding id, unique within the suite.
        names = [c.get("name") for c in cases]
        assert len(names) == len(set(names))
        assert suite.get("hostname") == "node-1" and suite.get("timestamp")
        assert suite.find("properties") is not None
        counted = {
            "tests": len(cases),
            "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": sum(1 for c in cases if c.find("error") is not None),
            "skipped": sum(1 for c in cases if c.find("skipped") is not None),
        }
        for key, value in counted.items():
            assert int(suite.get(key)) == value, (suite.get("name"), key)
            totals[key] += value
        for case in cases:
            assert case.get("classname") == suite.get("name")
            assert float(case.get("time")) >= 0
            # At most one outcome element per test case.
            assert sum(case.find(t) is not None for t in ("failure", "error", "skipped")) <= 1
    for key, value in totals.items():
        assert int(root.get(key)) == value
    # 7 distinct ids; the two gpu.ecc.uncorrectable findings share one test case.
    assert totals == {"tests": 7, "failures": 2, "errors": 1, "skipped": 1}


def test_junit_outcomes_and_text() -> None:
    root = _junit()
    case = {c.get("name"): c for c in root.iter("testcase")}
    ecc = case["gpu.ecc.uncorrectable"].find("failure")
    assert ecc.get("type") == "fail" and "(and 1 more)" in ecc.get("message")
    assert "GPU 3 has 2 uncorrectable errors" in ecc.text and "fix: Run `nvidia-smi -r`" in ecc.text
    assert "\n" not in ecc.get("message")
    assert case["rdma.probe"].find("error").get("type") == "error"
    assert case["gpu.mig"].find("skipped") is not None
    # warn passes unless --strict
    assert case["net.hostname.loopback"].find("failure") is None
    assert "[WARN]" in case["net.hostname.loopback"].find("system-out").text
    assert case["lint.DDP001"].get("file") == "train,v2:final.py" and case["lint.DDP001"].get("line") == "12"
    strict = {c.get("name"): c for c in _junit(strict=True).iter("testcase")}
    assert strict["net.hostname.loopback"].find("failure") is not None
    # XML cannot carry NUL/BEL: they were replaced, and the rest of the text survives.
    assert "\x00" not in render_junit(DOC) and "ctl" in ecc.text


def test_github_lines_match_the_workflow_command_grammar() -> None:
    text = render_github(DOC)
    lines = text.splitlines()
    assert text.endswith("\n")
    parsed = []
    for line in lines:
        m = GITHUB_LINE.match(line)
        assert m, line
        props = dict(p.split("=", 1) for p in (m.group("props") or "").split(",") if p)
        parsed.append(
            (
                m.group("kind"),
                {k: unescape_github(v) for k, v in props.items()},
                unescape_github(m.group("message")),
            )
        )
    kinds = [k for k, _, _ in parsed]
    # fail x3 and error -> error; warn -> warning; info/skip/ok hidden without -v; one closing notice.
    assert kinds.count("error") == 4 and kinds.count("warning") == 1 and kinds.count("notice") == 1
    assert parsed[-1][2] == "3 fail, 1 error, 1 warn, 1 skip, 1 info, 1 ok -> exit 1"
    first = next(p for p in parsed if p[1].get("title", "").startswith("gpu.ecc.uncorrectable"))
    # Round trip: what the runner decodes is exactly the finding's text.
    assert first[1]["title"] == "gpu.ecc.uncorrectable: Title: with, punctuation fail"
    # A CRLF line end arrives as LF; other controls are shown as escapes, never sent (#26).
    assert first[2].startswith("50% of links down:\nline two\n")
    assert "pipe \\x00\\x07 ctl" in first[2]
    assert first[2].endswith("\nfix: Run `nvidia-smi -r` (100%: sure)")
    lint = next(p for p in parsed if p[1].get("file"))
    assert lint[1]["file"] == "train,v2:final.py" and lint[1]["line"] == "12" and lint[1]["col"] == "5"


def test_github_strict_and_verbose() -> None:
    strict = [GITHUB_LINE.match(x).group("kind") for x in render_github(DOC, strict=True).splitlines()]
    assert "warning" not in strict and strict.count("error") == 5
    verbose = render_github(DOC, verbose=True).splitlines()
    assert len(verbose) == len(FINDINGS) + 1 and all(GITHUB_LINE.match(x) for x in verbose)


@given(st.text())
def test_github_escaping_round_trips_and_never_breaks_a_line(text: str) -> None:
    data, prop = escape_github_data(text), escape_github_property(text)
    assert "\n" not in data and "\r" not in data
    assert not set(prop) & set(",:\r\n")
    assert unescape_github(data) == text and unescape_github(prop) == text


def _table_rows(md: str) -> list[str]:
    return [x for x in md.splitlines() if x.startswith("| ") and not x.startswith("| severity")]


def test_markdown_structure() -> None:
    md = render_markdown(DOC)
    assert md.startswith("## ddpdoctor check on node-1\n")
    assert "3 fail, 1 error, 1 warn, 1 skip, 1 info, 1 ok · exit 1" in md
    rows = _table_rows(md)
    assert len(rows) == len([f for f in FINDINGS if f.severity != Severity.OK])
    for row in rows:
        # 4 columns: exactly 5 unescaped pipes; newlines became <br>; no raw HTML from tool output.
        assert len(re.findall(r"(?<!\\)\|", row)) == 5, row
        assert "<b>" not in row and "\x00" not in row
        assert "&lt;b&gt;" in row or "pipe" not in row
    assert rows[0].startswith("| **FAIL** |")
    assert "#### Fixes" not in md and "### Fixes" in md
    assert "<details><summary>1 check passed</summary>" in md
    assert md.count("<details>") == md.count("</details>") == 2
    # The evidence excerpt holds ``` : its fence is longer, so it cannot close early.
    assert "````\n```\nGPU 0: ERR!\n```\n````" in md


def test_md_code_block_is_never_closed_by_its_content() -> None:
    block = md_code_block("a ````` b")
    assert block.startswith("``````\n") and block.endswith("\n``````")


def test_prolog_lines() -> None:
    lines = render_prolog(FINDINGS)
    assert len(lines) == 4  # 3 fail + 1 error; warn only with strict
    assert all("\n" not in x and "\r" not in x and '"' not in x and len(x) <= PROLOG_LINE_MAX for x in lines)
    assert lines[0].startswith("gpu.ecc.uncorrectable: 50% of links down: line two")
    assert len(render_prolog(FINDINGS, strict=True)) == 5
    assert render_prolog([f for f in FINDINGS if f.severity <= Severity.WARN]) == []
    long = nasty(Severity.FAIL, "x.y", summary="word " * 100)
    assert render_prolog([long])[0].endswith("...") and len(render_prolog([long])[0]) == PROLOG_LINE_MAX


# --- through the CLI, on replayed snapshots -----------------------------------------------------------


def _check(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["check", *args])
    return res.exit_code, res.stdout


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


@pytest.mark.parametrize("snapshot", [HEALTHY, MISMATCHED])
def test_check_json_validates_against_the_published_schema(snapshot: Path) -> None:
    code, out = _check("--replay", str(snapshot), "--format", "json", "--expect", str(H100))
    data = json.loads(out)
    jsonschema.validate(data, _schema("check.schema.json"))
    assert data["exit_code"] == code
    assert any(f["id"].startswith("expect.") for f in data["findings"])


def test_json_alias_gives_the_same_document() -> None:
    _, a = _check("--replay", str(HEALTHY), "--json")
    _, b = _check("--replay", str(HEALTHY), "--format", "json")
    strip = lambda s: {k: v for k, v in json.loads(s).items() if k != "duration_s"}  # noqa: E731
    assert strip(a) == strip(b)


def test_schema_rejects_a_broken_document() -> None:
    _, out = _check("--replay", str(HEALTHY), "--format", "json")
    data = json.loads(out)
    data["findings"].append({"id": "x.y", "severity": "catastrophic"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, _schema("check.schema.json"))


def test_every_schema_is_a_valid_versioned_schema() -> None:
    schemas = sorted(SCHEMAS.glob("*.schema.json"))
    assert schemas
    for path in schemas:
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"].endswith(path.name)
        # Versioned: the document names its schema version, e.g. "ddpdoctor.check/1".
        version = schema["properties"]["schema"]
        assert re.fullmatch(
            r"(\^)?ddpdoctor(\.[a-z_-]+)+/\d+\$?", version.get("const") or version.get("pattern")
        )


def test_check_junit_github_markdown_on_a_failing_replay() -> None:
    args = ("--replay", str(MISMATCHED), "--expect", str(H100))
    code, out = _check(*args, "--format", "junit")
    assert code == 1
    root = ET.fromstring(out)
    expect_suite = next(s for s in root.iter("testsuite") if s.get("name") == "ddpdoctor.check.expect")
    failed = {c.get("name") for c in expect_suite.iter("testcase") if c.find("failure") is not None}
    assert {"expect.gpu.count", "expect.gpu.model", "expect.rdma.ports", "expect.system.shm"} <= failed
    errored = {c.get("name") for c in expect_suite.iter("testcase") if c.find("error") is not None}
    assert "expect.nccl.version" in errored  # CPU torch: no NCCL to judge, never a pass
    code, out = _check(*args, "--format", "github")
    assert code == 1 and all(GITHUB_LINE.match(x) for x in out.splitlines())
    assert any(x.startswith("::error title=expect.gpu.count%3A") for x in out.splitlines())
    code, out = _check(*args, "--format", "markdown")
    assert code == 1 and "| **FAIL** | `expect.gpu.count` |" in out


def test_unknown_format_is_a_usage_error() -> None:
    code, _ = _check("--replay", str(HEALTHY), "--format", "yaml")
    assert code == 2


# --- lint, explain and bench-nccl through their commands ----------------------------------------------

SCRIPT = (
    "import torch\n"
    "import torch.distributed as dist\n"
    'dist.init_process_group("nccl")\n'
    'torch.save({}, "ckpt.pt")\n'
)
# Real log lines (shared/reference/signatures.md S01, quoted from pytorch/pytorch#85604 and others).
LOG = (
    "[W socket.cpp:401] [c10d] The server socket has failed to bind to 0.0.0.0:47531 "
    "(errno: 98 - Address already in use).\n"
    "[E socket.cpp:435] [c10d] The server socket has failed to listen on any local network address.\n"
)


def _run(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout


def test_lint_every_format(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # Every rule (both tiers): the opinionated DDP009/DDP010 are the findings on line 3.
    code, out = _run("lint", "--select", "ALL", str(script), "--format", "json")
    assert code == 1
    data = json.loads(out)
    jsonschema.validate(data, _schema("lint.schema.json"))
    codes = set(data["counts"])
    code, out = _run("lint", "--select", "ALL", str(script), "--format", "junit")
    assert code == 1
    root = ET.fromstring(out)
    cases = list(root.iter("testcase"))
    assert {c.get("name") for c in cases} == codes
    assert all(c.find("failure") is not None and c.get("file") == str(script) for c in cases)
    assert int(root.get("failures")) == len(codes)
    code, out = _run("lint", "--select", "ALL", str(script), "--format", "github")
    assert code == 1 and all(GITHUB_LINE.match(x) for x in out.splitlines())
    code, out = _run("lint", "--select", "ALL", str(script), "--format", "markdown")
    assert code == 1 and "| **FAIL** | `DDP" in out and f"({script}:3:1)" in out
    assert _run("lint", "--select", "ALL", str(script), "--format", "table")[0] == 1
    clean = tmp_path / "clean.py"
    clean.write_text("print('hello')\n")
    code, out = _run("lint", str(clean), "--format", "junit")
    assert code == 0 and ET.fromstring(out).get("failures") == "0"


def test_explain_every_format(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text(LOG)
    code, out = _run("explain", str(log), "--format", "json")
    assert code == 1
    data = json.loads(out)
    jsonschema.validate(data, _schema("explain.schema.json"))
    root_id = data["root_cause"]["id"]
    code, out = _run("explain", str(log), "--format", "junit")
    suites = {s.get("name"): s for s in ET.fromstring(out).iter("testsuite")}
    root_case = suites["ddpdoctor.explain.root_cause"].find("testcase")
    assert code == 1 and root_case.get("name") == root_id and root_case.find("failure") is not None
    assert root_case.get("file") == str(log) and root_case.get("line") == "1"
    code, out = _run("explain", str(log), "--format", "github")
    lines = out.splitlines()
    assert code == 1 and all(GITHUB_LINE.match(x) for x in lines)
    assert lines[0].startswith(f"::error title={escape_github_property(root_id)}")
    code, out = _run("explain", str(log), "--format", "markdown")
    assert code == 1 and f"`{root_id}`" in out and "Root cause" in out
    assert _run("explain", str(log), "--format", "yaml")[0] == 2



def test_explain_github_one_error_per_root_cause_consequences_as_warnings() -> None:
    # QA pass: one root cause and its consequences were three ::error annotations. Real H100 log.
    log = Path(__file__).parent / "fixtures" / "explain" / "real-h100" / "dup_gpu.log"
    code, out = _run("explain", str(log), "--json")
    data = json.loads(out)
    assert code == 1 and data["root_cause"] and len(data["consequences"]) >= 2
    code, out = _run("explain", str(log), "--format", "github")
    kinds = [(m.group("kind"), m.group("props")) for m in map(GITHUB_LINE.match, out.splitlines()) if m]
    assert code == 1 and len(kinds) == len(out.splitlines())
    assert [k for k, _ in kinds].count("error") == 1
    assert kinds[0][0] == "error" and escape_github_property(data["root_cause"]["id"]) in kinds[0][1]
    warned = [p for k, p in kinds if k == "warning"]
    assert len(warned) == len(data["consequences"])
    for d in data["consequences"]:
        assert any(escape_github_property(d["id"]) in p for p in warned), d["id"]


BENCH = (
    "bench-nccl",
    "--nproc",
    "2",
    "--backend",
    "gloo",
    "--ops",
    "all_reduce",
    "--min-bytes",
    "1K",
    "--max-bytes",
    "2K",
    "--iters",
    "2",
    "--warmup",
    "1",
    "--timeout",
    "60",
)


def test_bench_every_format_and_expectations(tmp_path: Path) -> None:
    # Real gloo ranks. A minimum no CPU can miss passes; the PCIe example's 10 GB/s cannot be met by
    # gloo on this machine's CPU and must fail.
    easy = tmp_path / "easy.toml"
    easy.write_text("[busbw_min_gbps]\nall_reduce = 0.000001\nall_gather = 1\n")
    code, out = _run(*BENCH, "--format", "json", "--expect", str(easy))
    assert code == 0, out
    data = json.loads(out)
    jsonschema.validate(data, _schema("bench.schema.json"))
    by_id = {f["id"]: f for f in data["expectations"]}
    assert by_id["expect.busbw.all_reduce"]["severity"] == "ok"
    assert by_id["expect.busbw.all_gather"]["severity"] == "skip"  # not measured: never a pass
    for fmt in ("github", "markdown", "junit"):
        from ddpdoctor.render.formats import document_from_bench, render_document

        text = render_document(fmt, document_from_bench(data))
        if fmt == "github":
            assert all(GITHUB_LINE.match(x) for x in text.splitlines())
        elif fmt == "junit":
            names = {c.get("name") for c in ET.fromstring(text).iter("testcase")}
            assert {"bench.correctness", "bench.busbw.all_reduce"} <= names
    code, out = _run(
        *BENCH,
        "--format",
        "junit",
        "--expect",
        str(ROOT / "docs/examples/pcie-workstation-4x-rtx6000ada.toml"),
    )
    assert code == 1
    failed = {c.get("name") for c in ET.fromstring(out).iter("testcase") if c.find("failure") is not None}
    assert failed == {"expect.busbw.all_reduce"}
    assert _run(*BENCH, "--format", "junit", "--json", "-")[0] == 2
