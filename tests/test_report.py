"""Secrets planted in the environment reach no output: every format of check, the prolog lines, the report
and the snapshot files. Plus the report's content on a replayed snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app
from ddpdoctor.core.engine import Area
from ddpdoctor.core.model import Evidence, Severity, define
from ddpdoctor.edge.sources import REDACTED, redact_data, redact_text
from ddpdoctor.render.formats import FORMATS

CI = Path(__file__).parent / "fixtures" / "ci"
HEALTHY = CI / "healthy-cpu-node"
MISMATCHED = CI / "mismatched-gpu-node"

SECRETS = {
    "HF_TOKEN": "hf_PlantedHuggingFaceToken0123456789",
    "WANDB_API_KEY": "planted0wandb1api2key3value4567890abcdef",
    "AWS_SECRET_ACCESS_KEY": "Planted/Aws+Secret/Access0Key1234567890",
    "NCCL_PLUGIN_AUTH_TOKEN": "planted-nccl-plugin-token-42",
    "MY_DB_PASSWORD": "Planted-Db-Passw0rd!",
    "GITHUB_CREDENTIALS": "ghp_PlantedGithubCredential987654321",
}
URL_PASSWORD = "PlantedUrlPassw0rd"
URL_VARS = {
    # Innocent names, credentials inside URLs (the password even holds an '@').
    "PIP_INDEX_URL": f"https://builder:{URL_PASSWORD}@pypi.internal.example.com/simple",
    "TORCH_DISTRIBUTED_STORE_URL": f"redis://store:{URL_PASSWORD}x@y@store.example.com:6379/0",
}
NEEDLES = [*SECRETS.values(), URL_PASSWORD]

LEAK = define(
    "test.leak.quoted",
    "A check that quotes secrets",
    "Test only: a finding that quotes a command line and the environment, as a port-holder finding does.",
    "Nothing.",
)


def _leaky_collect(ctx):
    import os

    return {k: os.environ.get(k, "") for k in [*SECRETS, *URL_VARS]}


def _leaky_judge(values):
    text = " ".join(f"{k}={v}" for k, v in values.items())
    return [
        LEAK.finding(
            Severity.FAIL,
            f"holder: python train.py --token {values['HF_TOKEN']} {values['PIP_INDEX_URL']}",
            evidence=[Evidence(f"ps -o args {values['WANDB_API_KEY']}", text)],
            fix=f"export AWS_SECRET_ACCESS_KEY={values['AWS_SECRET_ACCESS_KEY']}",
            data={"env": dict(values), "argv": ["--password", values["MY_DB_PASSWORD"]]},
        )
    ]


LEAKY = Area(name="leaky", title="Leaky test area", collect=_leaky_collect, judge=_leaky_judge, order=99)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {**SECRETS, **URL_VARS}.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def leaky_areas(monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpdoctor.checks as checks

    real = checks.load_areas
    monkeypatch.setattr(checks, "load_areas", lambda: [*real(), LEAKY])


def assert_clean(text: str, where: str) -> None:
    for needle in NEEDLES:
        assert needle not in text, f"{needle!r} leaked into {where}"


def _fast_skip() -> list[str]:
    # torch-info imports torch in a subprocess: skipped in the per-format runs, covered once below.
    from ddpdoctor.checks import load_areas

    names = {a.name for a in load_areas()}
    return [x for x in ("torch", "mp") if x in names]


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_secret_in_any_check_format(planted, leaky_areas, fmt: str) -> None:
    skip = ",".join(_fast_skip())
    args = ["check", "--format", fmt, "-v", "--timeout", "20"] + (["--skip", skip] if skip else [])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, res.output  # the leaky area fails
    assert "leaky" in res.stdout or "test.leak.quoted" in res.stdout or fmt == "table"
    assert_clean(res.stdout + res.stderr, f"check --format {fmt}")
    assert REDACTED in res.stdout or fmt == "table" or "&lt;redacted&gt;" in res.stdout


def test_no_secret_in_prolog_lines_or_json_alias(planted, leaky_areas) -> None:
    for extra in (["--prolog"], ["--json"]):
        res = CliRunner().invoke(app, ["check", *extra, "--replay", str(HEALTHY)])
        assert res.exit_code == 1
        assert "test.leak.quoted" in res.stdout
        assert_clean(res.stdout, " ".join(extra))


def test_no_secret_in_a_full_live_check(planted) -> None:
    # Every real area, the torch subprocess included (it inherits the planted environment).
    res = CliRunner().invoke(app, ["check", "--format", "json", "--timeout", "60"])
    assert res.exit_code in (0, 1, 3)
    assert_clean(res.stdout, "live check --format json")


def test_no_secret_in_snapshot_files(planted, tmp_path: Path) -> None:
    skip = ",".join(_fast_skip())
    res = CliRunner().invoke(
        app, ["snapshot", str(tmp_path), "--timeout", "20"] + (["--skip", skip] if skip else [])
    )
    assert res.exit_code == 0, res.output
    files = sorted(tmp_path.iterdir())
    assert any(p.name == "env.json" for p in files)
    env_text = (tmp_path / "env.json").read_text()
    assert "HF_TOKEN" in env_text and REDACTED in env_text  # the variable is kept, its value is not
    for path in files:
        assert_clean(path.read_text(errors="replace"), f"snapshot {path.name}")


def test_report_has_no_secret_and_its_sections(planted, leaky_areas, tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    res = CliRunner().invoke(app, ["report", "-o", str(out), "--timeout", "60"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert_clean(text, "report")
    for section in (
        "## Versions",
        "## Check findings",
        "## GPU topology",
        "## InfiniBand / RDMA",
        "## Environment",
        "## Raw outputs",
    ):
        assert section in text, section
    # The planted variables that shape a job are listed, with their values redacted.
    assert "NCCL_PLUGIN_AUTH_TOKEN=<redacted>" in text
    assert "TORCH_DISTRIBUTED_STORE_URL=redis://<redacted>@store.example.com:6379/0" in text
    assert "test.leak.quoted" in text
    assert text.count("<details>") == text.count("</details>")


def test_report_from_a_replayed_snapshot(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", "--replay", str(MISMATCHED)])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert text.startswith("# ddpdoctor report: vm\n")
    assert "| NVIDIA driver | 525.105.17 |" in text and "| CUDA (driver) | 12.0 |" in text
    assert "| GPUs | 1 x NVIDIA H800 |" in text
    assert "| mlx5_0 | MT4124 | 20.41.1000 | 1 | Active | LinkUp | 200 | InfiniBand |" in text
    assert "GPUDirect RDMA module: not loaded" in text
    # Raw outputs collapsed, one block per probe read from the snapshot.
    assert "<details><summary>nvidia-smi-q: nvidia-smi -q (exit 0)</summary>" in text
    assert "<details><summary>ibstat: ibstat (exit 255)</summary>" in text
    assert "Not available: " in text.split("## GPU topology", 1)[1].split("##", 1)[0]
    assert CliRunner().invoke(app, ["report", "--replay", str(MISMATCHED), "--bench"]).exit_code == 2


def test_report_header_lists_the_redaction_rules_applied() -> None:
    # QA pass: the header named six words while PASS, PWD, COOKIE, SESSION, WEBHOOK, token formats and
    # presigned URLs were redacted too. It is now built from the rules themselves.
    from ddpdoctor.edge.redact import SECRET_NAME_SEGMENTS, SECRET_NAME_WORDS

    res = CliRunner().invoke(app, ["report", "--replay", str(MISMATCHED)])
    assert res.exit_code == 0, res.output
    header = res.stdout.split("## Versions", 1)[0]
    for word in SECRET_NAME_WORDS:
        assert f"`{word}`" in header, word
        # Every word the header names is one that is redacted.
        assert redact_data({f"MY_{word}_X": "s3cr3t-value-123"}) == {f"MY_{word}_X": REDACTED}, word
    for segment in SECRET_NAME_SEGMENTS:
        assert f"`_{segment}`" in header, segment
        assert redact_data({f"DB_{segment}": "s3cr3t-value-123"}) == {f"DB_{segment}": REDACTED}, segment
    for named in ("COOKIE", "WEBHOOK", "presigned", "Hugging Face", "credentials in URLs", "docs/inputs.md"):
        assert named in header, named
    signed = redact_text("https://bucket/x?X-Amz-Signature=abc123def")
    assert signed == "https://bucket/x?X-Amz-Signature=" + REDACTED


def test_redaction_helpers() -> None:
    env = {"HF_TOKEN": "abcd1234", "SHORT_KEY": "ab", "AUTH_MODE": "none", "PATH": "/usr/bin"}
    assert redact_text("token abcd1234 and none and ab", env) == f"token {REDACTED} and none and ab"
    assert redact_text("https://u:p@ss@host/x", {}) == f"https://{REDACTED}@host/x"
    assert redact_text("http://host:8080/path a@b", {}) == "http://host:8080/path a@b"
    data = {"env": {"HF_TOKEN": "zzz", "pkey": "0xffff"}, "list": ["abcd1234", 3, None]}
    assert redact_data(data, env) == {
        "env": {"HF_TOKEN": REDACTED, "pkey": "0xffff"},
        "list": [REDACTED, 3, None],
    }
    # A longer secret containing a shorter one is not left half replaced.
    both = {"A_TOKEN": "secret", "B_TOKEN": "secret-and-more"}
    assert redact_text("x secret-and-more y", both) == f"x {REDACTED} y"


def test_literal_redaction_spares_values_that_do_not_look_like_secrets() -> None:
    # Secret-named variables with ordinary values: replacing those everywhere would garble the report.
    env = {
        "SESSION_TIMEOUT": "1000",
        "AUTH_METHOD": "password",
        "KEY_VERSION": "2.28.9",
        "SESSION_PIN": "12345678",
        "DB_PASSWORD": "hunter2x9",
        "HF_TOKEN": "hf_AbCdEfGhIjKlMnOpQrStUv",
    }
    text = "all_reduce 1000 bytes in 2.28.9, auth by password; db hunter2x9 hf_AbCdEfGhIjKlMnOpQrStUv"
    assert redact_text(text, env) == (
        f"all_reduce 1000 bytes in 2.28.9, auth by password; db {REDACTED} {REDACTED}"
    )
    # Assigned values are still redacted whatever they look like.
    assert redact_text("API_KEY=12345678 DB_PASSWORD: 1000", env) == (
        f"API_KEY={REDACTED} DB_PASSWORD: {REDACTED}"
    )


@pytest.mark.parametrize(
    ("text", "leaked"),
    [
        # A log from another machine: the values are in no local environment variable.
        (
            "[rank0]: NCCL WARN x HF_TOKEN=hf_secretvalue123 WANDB_API_KEY=abcd1234",
            ["hf_secretvalue123", "abcd1234"],
        ),
        ('{"password": "hunter2", "user": "bob"}', ["hunter2"]),
        (
            "python train.py --api-key=k3y-v4lue --hub_token hf_abcdefghijklmnopqrstuvwxyz",
            ["k3y-v4lue", "hf_abcdef"],
        ),
        (
            "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG AKIAIOSFODNN7EXAMPLE",
            ["wJalrX", "AKIAIOSFODNN7EXAMPLE"],
        ),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", ["eyJhbGci"]),
        ("git clone https://ghp_1234567890abcdefghijABCDEFGHIJ@github.com/x", ["ghp_1234"]),
    ],
)
def test_secrets_in_free_text_are_redacted(text: str, leaked: list[str]) -> None:
    out = redact_text(text, {})
    assert REDACTED in out and not [s for s in leaked if s in out], out


def test_redaction_leaves_diagnostics_alone() -> None:
    text = (
        "NCCL_IB_PKEY=0 AUTHOR=me AUTH_MODE=none NCCL_SOCKET_IFNAME=eth0 max_tokens=512 tokenizer=bpe "
        "Port GUID: 0x1234 PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128 pad_token=<pad>"
    )
    assert redact_text(text, {}) == text


def test_report_benchmark_says_what_was_measured() -> None:
    # QA pass: `report --bench` on a CPU node printed "1 MiB ... 0.28 GB/s" under "Benchmark (short)" with
    # no word that it was gloo on 2 CPU ranks: read as NCCL, it looks like a broken interconnect.
    from types import SimpleNamespace

    from ddpdoctor.render.report import _bench_section

    row = {"op": "all_reduce", "size": 1048576, "time_us": 3741.9, "algbw": 0.28, "busbw": 0.28, "wrong": 0}
    gloo = {
        "config": {"backend": "gloo", "world_size": 2, "dtype": "float32", "timing": "eager"},
        "environment": {"host": "vm", "backend": "gloo", "world_size": 2, "gpus": []},
        "rows": [row],
    }
    lines = _bench_section(SimpleNamespace(bench=gloo, bench_error=""))
    assert lines[0].startswith("bench-nccl with gloo, 2 rank(s) on vm, float32, eager timing")
    assert "not a GPU interconnect" in lines[0]
    nccl = {
        "config": {"backend": "nccl", "world_size": 8, "dtype": "float32", "timing": "graph"},
        "environment": {"host": "n1", "gpus": ["NVIDIA H100 80GB HBM3"] * 8},
        "rows": [row],
    }
    first = _bench_section(SimpleNamespace(bench=nccl, bench_error=""))[0]
    assert first == "bench-nccl with nccl, 8 rank(s) on n1 (8x NVIDIA H100 80GB HBM3), float32, graph timing."
    # Garbage in the JSON's setup fields is shown as unknown, never a traceback.
    odd = _bench_section(SimpleNamespace(bench={"config": "x", "environment": [1], "rows": [row]}, bench_error=""))
    assert odd[-1].startswith("| all_reduce |")
