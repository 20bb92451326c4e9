"""Precision, recall and speed of `ddpdoctor lint` on real public training scripts (a benchmark, not a test).

The corpus is listed in bench/lint-corpus/manifest.json (repository, path, commit, license: permissive
licenses only). The scripts are not committed; `extract` copies them out of local git snapshots
(`<mirror>/<owner>+<name>/repo`, one per repository) into bench/lint-corpus/files/<owner>+<name>/<path>:

  python bench/lint_corpus.py extract --mirror /work/.mirror
  python bench/lint_corpus.py score            # default tier, then the opinionated tier, then lines/s

The verdicts live in bench/lint-corpus/expected.json, written by reading the code before the rules were
tuned. Each entry names a file, a line, a rule id and a verdict:

  "bug"    a real bug or risk: the default tier must report it (a miss counts against recall)
  "style"  advice, not a bug: only the opinionated tier may report it
  "fp"     a false positive: nothing may report it

A default-tier finding that has no entry, or whose entry is "style" or "fp", is a false positive of the
default tier. Each repository is linted as one project (its files together), the way users run
`ddpdoctor lint src/`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent / "lint-corpus"
MANIFEST = HERE / "manifest.json"
EXPECTED = HERE / "expected.json"
FILES = HERE / "files"


def load_manifest() -> list[dict]:
    return json.loads(MANIFEST.read_text())["files"]


def repo_dir(repo: str) -> Path:
    return FILES / repo.replace("/", "+")


def local_path(entry: dict) -> Path:
    """Where a listed file is kept: its path in the repository, or `as` when two commits of one file are
    both in the corpus (a bug and its fix)."""
    return repo_dir(entry["repo"]) / entry.get("as", entry["path"])


def extract(mirror: Path) -> int:
    """Copy each listed file at its commit out of `<mirror>/<owner>+<name>/repo` (git show, no checkout)."""
    missing = 0
    for entry in load_manifest():
        git_dir = mirror / entry["repo"].replace("/", "+") / "repo"
        out = local_path(entry)
        proc = subprocess.run(
            ["git", "--git-dir", str(git_dir), "show", f"{entry['commit']}:{entry['path']}"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if proc.returncode != 0:
            print(f"missing: {entry['repo']} {entry['path']}@{entry['commit'][:10]}", file=sys.stderr)
            missing += 1
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(proc.stdout)
    print(f"extracted {len(load_manifest()) - missing} files into {FILES}")
    return 1 if missing else 0


def project_of(entry: dict) -> str:
    """The files linted together: a repository, except pytorch/examples, whose examples are separate
    projects (imagenet/, distributed/ddp/, distributed/FSDP/, ...)."""
    if "as" in entry:
        return entry["repo"] + ":" + entry["as"]  # each version of a file is a project of its own
    parts = entry["path"].split("/")
    if entry["repo"] == "pytorch/examples":
        return entry["repo"] + ":" + "/".join(parts[:2] if parts[0] == "distributed" else parts[:1])
    return entry["repo"]


def lint_corpus(rules, which: str = "all") -> tuple[list, int, float]:
    """Lint the corpus (`which`: "tuning", "held-out" or "all"), each project as one lint_paths call."""
    from ddpdoctor.lint import lint_paths

    entries = [e for e in load_manifest() if which == "all" or e.get("set", "tuning") == which]
    diags, lines, cpu = [], 0, 0.0
    for project in sorted({project_of(e) for e in entries}):
        paths = [local_path(e) for e in entries if project_of(e) == project]
        paths = [p for p in paths if p.exists()]
        if not paths:
            continue
        start = time.process_time()
        report = lint_paths(paths, rules)
        cpu += time.process_time() - start
        lines += report.lines
        for d in report.diagnostics:
            rel = Path(d.path).relative_to(FILES).as_posix()
            diags.append((rel, d.line, d.code, d.message))
    return diags, lines, cpu


# DDP021 is the opinion half of the old DDP003 (set_device right after init, nothing on the GPU in
# between), DDP029 that of DDP013 (--local_rank where the documented launch works); the verdicts were
# written against DDP003 and DDP013 before the splits.
ALIASES = {"DDP021": "DDP003", "DDP029": "DDP013"}


def score(
    label: str,
    diags: list,
    expected: dict,
    want: set[str],
    codes: set[str],
    files: set[str],
    split: frozenset[str] = frozenset(),
) -> tuple[int, int, int]:
    """`want`: the verdicts this tier should report; `codes`: the tier's rule ids (misses count only for
    them); `split`: ids shared with the other tier through ALIASES, whose `bug` verdicts are the default
    half's to report (timm's --local_rank is DDP013, not the opinionated DDP029)."""
    tp: Counter = Counter()
    fp: Counter = Counter()
    fn: Counter = Counter()
    got = {(p, line, ALIASES.get(code, code)) for p, line, code, _ in diags}
    for p, line, code, message in sorted(diags):
        verdict = expected.get((p, line, ALIASES.get(code, code)), "unlisted")
        if verdict in want:
            tp[code] += 1
        else:
            fp[code] += 1
            print(f"  FP  {p}:{line} {code} ({verdict}) {message}")
    for (p, line, code), verdict in sorted(expected.items()):
        if verdict in want and code in codes and p in files and (p, line, code) not in got:
            if code in split and verdict == "bug":
                continue
            fn[code] += 1
            print(f"  FN  {p}:{line} {code}")
    t, f_p, f_n = sum(tp.values()), sum(fp.values()), sum(fn.values())
    print(f"{label}: {t} true, {f_p} false positives, {f_n} missed")
    print(f"  precision {t / max(t + f_p, 1):.2f}   recall {t / max(t + f_n, 1):.2f}")
    for code in sorted(set(tp) | set(fp) | set(fn)):
        print(f"  {code}: TP {tp[code]} FP {fp[code]} FN {fn[code]}")
    return t, f_p, f_n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract", help="copy the listed files out of local git snapshots")
    ex.add_argument("--mirror", type=Path, default=Path("/work/.mirror"))
    sub.add_parser("score", help="precision/recall per tier, and lines/s")
    args = ap.parse_args(argv)
    if args.cmd == "extract":
        return extract(args.mirror)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from ddpdoctor.lint import RULES, default_rules

    present = sum(1 for e in load_manifest() if local_path(e).exists())
    if not present:
        print(
            f"lint corpus: no files under {FILES}; run `python bench/lint_corpus.py extract --mirror DIR` first (skipped)"
        )
        return 0
    raw = json.loads(EXPECTED.read_text())["findings"]
    expected = {(e["file"], e["line"], e["code"]): e["verdict"] for e in raw}
    default = default_rules()
    opinionated = [r for r in RULES.values() if r not in default]
    for which in ("tuning", "held-out", "regression", "all"):
        diags, lines, _ = lint_corpus(default, which)
        n_files = sum(
            1
            for e in load_manifest()
            if (which == "all" or e.get("set", "tuning") == which) and local_path(e).exists()
        )
        files = {
            local_path(e).relative_to(FILES).as_posix()
            for e in load_manifest()
            if which == "all" or e.get("set", "tuning") == which
        }
        print(f"\n=== {which} set: {n_files} files, {lines} lines")
        score("default tier", diags, expected, {"bug"}, {r.id for r in default}, files)
        diags_o, _, _ = lint_corpus(opinionated, which)
        score(
            "opinionated tier alone (style counts as true)",
            diags_o,
            expected,
            {"bug", "style"},
            {ALIASES.get(r.id, r.id) for r in opinionated},
            files,
            frozenset(ALIASES.values()),
        )
    best = min(lint_corpus(list(RULES.values()))[2] for _ in range(5))
    print(f"speed, all rules, project mode: {lines / best:,.0f} lines/s (CPU time, best of 5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
