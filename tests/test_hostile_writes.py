"""Issue #26, third attack pass, write safety (W1, W3, W4, W5), long names (T2, X2) and size options (T4):
every output file of every command goes through edge.files.write_output_file. Real files, real
symbolic and hard links, real FIFOs, real ddpdoctor processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "tests" / "fixtures" / "ci" / "healthy-cpu-node"
TINY = ("--backend", "gloo", "--nproc", "2", "--ops", "all_reduce", "--min-bytes", "8", "--max-bytes", "8",
        "--iters", "1", "--warmup", "0")  # fmt: skip


def ddpdoctor(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", *args], capture_output=True, text=True, timeout=240, cwd=cwd,
        env=dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO)),
    )  # fmt: skip


def world_writable(tmp_path: Path) -> Path:
    """A directory like /tmp: anyone may create entries (sticky, 1777)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


# W1: bench-nccl --json/--csv FILE neither writes through a link nor overwrites without --force.


@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_bench_output_refuses_a_symlink_and_an_existing_file(flag: str, tmp_path: Path) -> None:
    keep = tmp_path / "keep.txt"
    keep.write_text("KEEP\n")
    (tmp_path / "link.out").symlink_to(keep)
    out = ddpdoctor("bench-nccl", *TINY, flag, str(tmp_path / "link.out"))
    assert out.returncode == 2 and "symbolic link" in out.stderr and "nothing was run" in out.stderr
    out = ddpdoctor("bench-nccl", *TINY, flag, str(tmp_path / "link.out"), "--force")
    assert out.returncode == 2 and "symbolic link" in out.stderr
    assert keep.read_text() == "KEEP\n"
    out = ddpdoctor("bench-nccl", *TINY, flag, str(keep))
    assert out.returncode == 2 and "exists (use --force to overwrite)" in out.stderr
    assert keep.read_text() == "KEEP\n"


def test_bench_output_force_replaces_without_touching_a_hard_link(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("PRECIOUS\n")
    os.link(precious, tmp_path / "rows.csv")
    out = ddpdoctor("bench-nccl", *TINY, "--csv", str(tmp_path / "rows.csv"), "--json", str(tmp_path / "r.json"),
                    "--force")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert precious.read_text() == "PRECIOUS\n"
    assert (tmp_path / "rows.csv").read_text().startswith("op,size")
    assert '"rows"' in (tmp_path / "r.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt", "r.json", "rows.csv"]


# W3: --force replaces the file (a new inode); the file's other hard link keeps its content.


@pytest.mark.parametrize("command", [("report", "-o"), ("expect", "--write")])
def test_force_never_modifies_a_hard_link_in_place(command: tuple[str, str], tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("PRECIOUS\n")
    target = tmp_path / "out.md"
    os.link(precious, target)
    out = ddpdoctor(command[0], "--replay", str(SNAPSHOT), command[1], str(target))
    assert out.returncode == 2 and "exists (use --force" in out.stderr
    out = ddpdoctor(command[0], "--replay", str(SNAPSHOT), command[1], str(target), "--force")
    assert out.returncode == 0, out.stderr
    assert precious.read_text() == "PRECIOUS\n" and target.read_text() != "PRECIOUS\n"
    assert os.stat(target).st_ino != os.stat(precious).st_ino


# W4: a symbolic link among the directories, planted in a world-writable directory, is not followed.


@pytest.mark.parametrize("command", [("report", "-o"), ("expect", "--write"), ("check", "-o")])
def test_symlinked_parent_in_world_writable_directory_refused(command: tuple[str, str], tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    shared = world_writable(tmp_path)
    (shared / "etclink").symlink_to(victim)
    extra = ["--format", "prometheus", "--only", "system"] if command[0] == "check" else []
    out = ddpdoctor(command[0], "--replay", str(SNAPSHOT), *extra, command[1], str(shared / "etclink" / "x.md"))
    assert out.returncode == 2 and "world-writable" in out.stderr, out.stderr
    assert list(victim.iterdir()) == []


def test_symlinked_parent_of_ones_own_is_followed(tmp_path: Path) -> None:
    # ~/results -> /scratch/results: a link only its owner could make is the user's own layout.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "results").symlink_to(real)
    out = ddpdoctor("report", "--replay", str(SNAPSHOT), "-o", str(tmp_path / "results" / "r.md"))
    assert out.returncode == 0, out.stderr
    assert (real / "r.md").read_text().startswith("# ddpdoctor report")


# W5: a trailing '/' names a directory: refused, nothing written.


@pytest.mark.parametrize(
    "args",
    [
        ("report", "--replay", str(SNAPSHOT), "-o"),
        ("expect", "--replay", str(SNAPSHOT), "--write"),
        ("check", "--replay", str(SNAPSHOT), "--only", "system", "--format", "prometheus", "-o"),
        ("bench-nccl", *TINY, "--json"),
    ],
)
def test_trailing_slash_is_a_directory(args: tuple[str, ...], tmp_path: Path) -> None:
    out = ddpdoctor(*args, "newdir/", cwd=tmp_path)
    assert out.returncode == 2 and "ends in '/'" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_dash_is_stdout_for_check_output(tmp_path: Path) -> None:
    out = ddpdoctor("check", "--replay", str(SNAPSHOT), "--only", "system", "--format", "prometheus", "-o", "-",
                    cwd=tmp_path)  # fmt: skip
    assert "ddpdoctor_info" in out.stdout and list(tmp_path.iterdir()) == []


# T2 (rest) and X2: names the system refuses are usage errors before anything runs; a 250-byte name works.


@pytest.mark.parametrize(
    "args",
    [
        ("expect", "--replay", str(SNAPSHOT), "--write"),
        ("report", "--replay", str(SNAPSHOT), "-o"),
        ("bench-nccl", *TINY, "--json"),
        ("bench-nccl", *TINY, "--csv"),
        ("check", "--replay", str(SNAPSHOT), "--only", "system", "--format", "prometheus", "-o"),
    ],
)
def test_name_too_long_is_one_line_exit_2(args: tuple[str, ...], tmp_path: Path) -> None:
    out = ddpdoctor(*args, "e" * 300, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "too long" in out.stderr.lower()


def test_250_byte_output_name_is_written(tmp_path: Path) -> None:
    name = "p" * 250
    out = ddpdoctor("check", "--replay", str(SNAPSHOT), "--only", "system", "--format", "prometheus", "-o", name,
                    cwd=tmp_path)  # fmt: skip
    assert out.returncode != 3 and "could not write" not in out.stderr, out.stderr
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_fifo_output_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.md"
    os.mkfifo(fifo)
    out = ddpdoctor("report", "--replay", str(SNAPSHOT), "-o", str(fifo), "--force")
    assert out.returncode == 2 and "FIFO" in out.stderr


# T4: size options that no benchmark can run are usage errors.


@pytest.mark.parametrize(
    "sizes, message",
    [
        (("--min-bytes", "0"), "--min-bytes must be at least 1"),
        (("--min-bytes", "0", "--max-bytes", "8"), "--min-bytes must be at least 1"),
        (("--max-bytes", "0"), "--max-bytes must be at least 1"),
        (("--min-bytes", "-8"), "not a size"),
        (("--min-bytes", "9" * 5000), "digits"),
        (("--min-bytes", "64", "--max-bytes", "8"), "smaller than --min-bytes"),
    ],
)
def test_bad_sizes_are_usage_errors(sizes: tuple[str, ...], message: str) -> None:
    out = ddpdoctor("bench-nccl", "--backend", "gloo", "--nproc", "2", *sizes)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
