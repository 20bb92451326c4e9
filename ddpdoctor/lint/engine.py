"""Run the rules over sources: parse, judge, apply `# noqa`, sort. Pure, apart from `lint_paths` reading files."""

from __future__ import annotations

import ast
import functools
import gc
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from ddpdoctor.lint.discover import discover_files, read_launch_scripts, read_source
from ddpdoctor.lint.facts import ModuleFacts, live_body
from ddpdoctor.lint.project import Project
from ddpdoctor.lint.ruleset import RULES, Rule

JSON_SCHEMA_VERSION = "ddpdoctor.lint/1"
# Reported whatever --select/--ignore say: the file could not be linted at all.
SYNTAX_ERROR = "DDP000"

_NOQA_RE = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*))?", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One finding at a code location. Holds no source text: output never echoes the script."""

    path: str
    line: int
    col: int
    code: str
    message: str
    fix: str = ""
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "code": self.code,
            "name": self.name,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass
class LintReport:
    files: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    lines: int = 0
    # Directories left out and why (build output, a virtualenv, .gitignore): never skipped in silence.
    excluded: list[tuple[str, str]] = field(default_factory=list)
    # Local modules a named script imports, linted with it; and those that were not, with why.
    followed: list[str] = field(default_factory=list)
    not_followed: list[tuple[str, str]] = field(default_factory=list)
    # Set when a large tree was linted in parts: imports between parts were not followed.
    chunked: str = ""

    @property
    def exit_code(self) -> int:
        return 1 if self.diagnostics else 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.diagnostics:
            out[d.code] = out.get(d.code, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        from ddpdoctor import __version__

        return {
            "schema": JSON_SCHEMA_VERSION,
            "tool": {"name": "ddpdoctor", "version": __version__},
            "files_checked": len(self.files),
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "diagnostics": [d.to_dict() for d in self.diagnostics],
            "excluded": [{"path": p, "reason": r} for p, r in self.excluded],
            "followed_imports": list(self.followed),
            "not_followed": [{"module": m, "reason": r} for m, r in self.not_followed],
            "chunked": self.chunked,
        }


def select_rules(
    select: Sequence[str] = (), ignore: Sequence[str] = (), extend_select: Sequence[str] = ()
) -> list[Rule]:
    """Rules chosen by ids or id prefixes ("DDP00", "ALL"), like ruff: `select` replaces the default tier
    (the rules that report likely bugs), `extend_select` adds to it, `ignore` removes. Raises ValueError
    on unknown ids."""

    def matches(code: str, rule_id: str) -> bool:
        return code == "ALL" or rule_id.startswith(code)

    for code in [*select, *ignore, *extend_select]:
        if not any(matches(code.upper(), rid) for rid in RULES):
            raise ValueError(f"unknown rule id {code!r}; known: {', '.join(sorted(RULES))}")
    chosen = [
        r
        for r in RULES.values()
        if (any(matches(c.upper(), r.id) for c in select) if select else r.default)
        or any(matches(c.upper(), r.id) for c in extend_select)
    ]
    return [r for r in chosen if not any(matches(c.upper(), r.id) for c in ignore)]


def _noqa_codes(line: str) -> Optional[frozenset[str]]:
    """None: no noqa on the line; empty set: bare `# noqa` (everything); else the listed codes."""
    m = _NOQA_RE.search(line)
    if not m:
        return None
    codes = m.group("codes")
    if not codes:
        return frozenset()
    return frozenset(c.upper() for c in re.split(r"[\s,]+", codes) if c)


def _suppressed(code: str, lines: Sequence[str], line_numbers: Iterable[int]) -> bool:
    for n in line_numbers:
        if 1 <= n <= len(lines) and "noqa" in lines[n - 1].lower():
            codes = _noqa_codes(lines[n - 1])
            if codes is not None and (not codes or code in codes):
                return True
    return False


def _char_col(lines_b: Sequence[bytes], line: int, byte_offset: int) -> int:
    """AST columns are UTF-8 byte offsets; report 1-based character columns like editors do."""
    if 1 <= line <= len(lines_b):
        text = lines_b[line - 1]
        if not text.isascii():
            return len(text[:byte_offset].decode("utf-8", "replace")) + 1
    return byte_offset + 1


def parse_source(source: Union[bytes, str], path: str = "<string>") -> Union[ModuleFacts, Diagnostic]:
    """Parse one script into the facts the rules judge, or the DDP000 diagnostic saying why not."""
    data = source.encode("utf-8") if isinstance(source, str) else source
    try:
        tree = ast.parse(data, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 1
        col = exc.offset or 1
        return Diagnostic(
            path, line, col, SYNTAX_ERROR, f"syntax error: {exc.msg}", "fix the syntax", "syntax-error"
        )
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        return Diagnostic(path, 1, 1, SYNTAX_ERROR, f"cannot parse: {type(exc).__name__}", "", "syntax-error")
    try:
        facts = ModuleFacts(tree, data)
    except RecursionError:
        return Diagnostic(path, 1, 1, SYNTAX_ERROR, "cannot parse: RecursionError", "", "syntax-error")
    facts.path = path
    return facts


def lint_source(
    source: Union[bytes, str], path: str = "<string>", rules: Optional[Sequence[Rule]] = None
) -> list[Diagnostic]:
    """Lint one script's text on its own (every rule unless `rules` says otherwise). Never imports or
    executes it: `ast.parse` only."""
    parsed = parse_source(source, path)
    if isinstance(parsed, Diagnostic):
        return [parsed]
    return judge_facts(parsed, rules)


def _never_run_bodies(tree: ast.AST) -> list[tuple[int, int]]:
    """(first, last) lines of the functions whose first statement (after a docstring) raises: a stub
    (`raise NotImplementedError`, `raise ValueError("use the FSDP path")`) whose later lines never run, so
    nothing in them is reported (facts.live_body; relora's save_model_fsdp, held-out lint corpus 10)."""
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            live = live_body(node.body)
            if len(live) < len(node.body):
                spans.append((live[-1].lineno, node.end_lineno or node.body[-1].lineno))
    return spans


def judge_facts(facts: ModuleFacts, rules: Optional[Sequence[Rule]] = None) -> list[Diagnostic]:
    """Run the rules over one parsed file (with its project, when linted as part of one)."""
    path, data = facts.path, facts.source
    chosen = list(RULES.values()) if rules is None else list(rules)
    raw: list[tuple[Rule, ast.AST, str]] = []
    internal: list[Diagnostic] = []
    for rule in chosen:
        try:
            hits = list(rule.check(facts))
        except (
            RecursionError,
            MemoryError,
            ValueError,
            TypeError,
            AttributeError,
            KeyError,
            IndexError,
        ) as exc:
            # A rule tripping over odd code must not stop the others, nor pass the file silently.
            message = f"internal error in rule {rule.id} ({type(exc).__name__}); the rule was skipped"
            internal.append(
                Diagnostic(path, 1, 1, SYNTAX_ERROR, message, "please report it", "internal-error")
            )
            continue
        for hit in hits:
            if isinstance(hit, tuple):
                node, message = hit
            else:
                node, message = hit, rule.message
            raw.append((rule, node, message))
    if not raw:
        return internal
    lines_b = data.splitlines()
    lines = [b.decode("utf-8", "replace") for b in lines_b] if b"noqa" in data.lower() else []
    dead = _never_run_bodies(facts.tree)
    out: set[Diagnostic] = set()
    for rule, node, message in raw:
        line = getattr(node, "lineno", 1)
        end = getattr(node, "end_lineno", None) or line
        if lines and _suppressed(rule.id, lines, {line, end}):
            continue
        if any(first < line <= last for first, last in dead):
            continue
        col = _char_col(lines_b, line, getattr(node, "col_offset", 0))
        out.add(Diagnostic(path, line, col, rule.id, message, rule.fix, rule.name))
    return sorted(out | set(internal))


def _read_file(path: Path, shown: str) -> Union[bytes, Diagnostic]:
    try:
        return read_source(path)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        return Diagnostic(shown, 1, 1, SYNTAX_ERROR, f"cannot read file: {reason}", "", "unreadable")


def lint_file(
    path: Path, rules: Optional[Sequence[Rule]] = None, display: Optional[str] = None
) -> tuple[list[Diagnostic], int]:
    """Lint one file on its own; an unreadable file is reported, not raised. Returns (diagnostics, line count)."""
    shown = display or str(path)
    data = _read_file(path, shown)
    if isinstance(data, Diagnostic):
        return [data], 0
    return lint_source(data, shown, rules), data.count(b"\n")


def lint_paths(
    paths: Sequence[Union[str, Path]],
    rules: Optional[Sequence[Rule]] = None,
    project: bool = True,
    on_progress: Optional[Callable[[int, int, str], None]] = None,
) -> LintReport:
    """Discover the Python files under `paths` (honouring .gitignore) and lint them. With `project`
    (the default) the files are one project: imports between them are resolved (project.py), so a rule
    sees a `set_epoch` or a rank-0 check in another file. `on_progress(bytes done, bytes in all, where)`
    is called as each part of the tree is done (a progress bar)."""
    # Every file's tree stays alive until the project is judged: millions of AST objects, which the
    # cyclic collector would rescan again and again (end-to-end speed fell threefold). Nothing here
    # makes reference cycles worth collecting mid-run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _lint_project(paths, rules, project, on_progress or (lambda done, total, where: None))
    finally:
        if collecting:
            gc.enable()


# A tree past this many bytes of source is linted in parts of about PART_BYTES each (whole directories,
# in path order), so memory stays bounded (issue #24: 46 MB of torch took 1.6 GB as one project).
PROJECT_BYTES_LIMIT = 4 * 1024 * 1024
PART_BYTES = 2 * 1024 * 1024
# How many local modules `ddpdoctor lint train.py` follows from the scripts it is given.
FOLLOW_LIMIT = 400


def _lint_project(
    paths: Sequence[Union[str, Path]],
    rules: Optional[Sequence[Rule]],
    project: bool,
    on_progress: Callable[[int, int, str], None],
) -> LintReport:
    report = LintReport()
    excluded: list[tuple[Path, str]] = []
    launchers: list[Path] = []
    files = discover_files([Path(p) for p in paths], excluded, launchers)
    launch_text = read_launch_scripts(launchers)
    report.excluded = [(str(p), why) for p, why in excluded]
    named = [Path(p) for p in paths if not os.path.isdir(p)]
    sizes = [_size(f) for f in files]
    total = sum(sizes)
    on_progress(0, total, f"{len(files)} files")
    if not project or total <= PROJECT_BYTES_LIMIT:
        _lint_part(files, rules, project, report, follow_from=named if project else [], launch_text=launch_text)
        on_progress(total, total, "")
        return report
    parts: list[list[Path]] = [[]]
    held = 0
    previous_dir: Optional[Path] = None
    for file, size in zip(files, sizes):
        # Cut only between directories, so a package's modules stay together where they fit.
        if held >= PART_BYTES and file.parent != previous_dir:
            parts.append([])
            held = 0
        parts[-1].append(file)
        held += size
        previous_dir = file.parent
    report.chunked = (
        f"{sum(sizes) / 2**20:.0f} MB of source linted in {len(parts)} parts of about "
        f"{PART_BYTES // 2**20} MB (whole directories): calls between parts were not followed"
    )
    done = 0
    for part in parts:
        _lint_part(part, rules, project, report, follow_from=[f for f in named if f in part], launch_text=launch_text)
        done += sum(_size(f) for f in part)
        on_progress(done, total, str(part[-1].parent) if part else "")
    return report


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _lint_part(
    files: list[Path],
    rules: Optional[Sequence[Rule]],
    project: bool,
    report: LintReport,
    follow_from: Sequence[Path] = (),
    launch_text: bytes = b"",
) -> None:
    """Parse, link and judge some files as one project, then free them. `launch_text`: the launch scripts found
    beside them (how the repository starts its programs)."""
    parsed: list[tuple[Path, ModuleFacts]] = []
    queue = list(files)
    known = {os.path.realpath(f) for f in queue}
    following = {os.path.realpath(f) for f in follow_from}
    while queue:
        file = queue.pop(0)
        shown = str(file)
        report.files.append(shown)
        data = _read_file(file, shown)
        if isinstance(data, Diagnostic):
            report.diagnostics.append(data)
            continue
        report.lines += data.count(b"\n")
        facts = parse_source(data, shown)
        if isinstance(facts, Diagnostic):
            report.diagnostics.append(facts)
            continue
        facts.launch_text = launch_text
        parsed.append((file, facts))
        if os.path.realpath(file) in following:
            # `ddpdoctor lint train.py`: the local modules it imports are part of the program.
            for module, local in local_imports(file, facts):
                key = os.path.realpath(local)
                if key in known:
                    continue
                known.add(key)
                if len(report.followed) >= FOLLOW_LIMIT:
                    report.not_followed.append((module, f"more than {FOLLOW_LIMIT} local modules"))
                    continue
                report.followed.append(str(local))
                following.add(key)
                queue.append(local)
    parsed = _shared_main_flags(parsed, across=project and len(parsed) > 1)
    if project and len(parsed) > 1:
        Project(parsed)
    for _, facts in parsed:
        report.diagnostics.extend(judge_facts(facts, rules))
    for _, facts in parsed:
        facts.release()  # freed by reference counting, not left for a full collection in the caller


def _shared_main_flags(parsed: list[tuple[Path, ModuleFacts]], across: bool = True) -> list[tuple[Path, ModuleFacts]]:
    """Read a rank-0 flag one file sets on a shared object (`args.should_save = args.rank == 0` in a setup
    module) as a guard in the files that test it (`if args.should_save: torch.save(...)`): those files are
    walked again knowing it. `self.` attributes stay per file (another class's `self`). Held-out lint corpus
    10: a checkpoint saved under `args.should_save`, set in another file, was reported as saved on every rank."""
    flags = {k for _, f in parsed for k in f.main_vars if "." in k and not k.startswith("self.")}
    if not flags:
        return parsed
    out = []
    for path, facts in parsed:
        extra = frozenset(k for k in flags if across and k not in facts.main_vars and k.encode() in facts.source)
        # A flag this file sets below a function that tests it (open_lm's main() sets `args.save_logs = ... and
        # is_master(args)` after save_checkpoint's `if args.save_logs:`, held-out corpus 12): walked again too.
        own = frozenset(k for k in facts.main_vars if k in flags)
        if extra or own:
            again = ModuleFacts(facts.tree, facts.source, extra | own)
            again.path, again.launch_text = facts.path, facts.launch_text
            facts = again
        out.append((path, facts))
    return out


def _import_roots(script: Path) -> list[Path]:
    """Where a script's absolute imports may resolve: its directory (sys.path[0]) and the directories
    above it up to the repository root (`python tools/train.py` with the package installed in place)."""
    here = Path(os.path.abspath(script)).parent
    roots = [here]
    for parent in here.parents:
        if len(roots) > 4:
            break
        roots.append(parent)
        if (
            os.path.exists(parent / ".git")
            or os.path.exists(parent / "pyproject.toml")
            or os.path.exists(parent / "setup.py")
        ):
            break
    return roots


@functools.lru_cache(maxsize=4096)
def _module_file(root: Path, dotted_name: str) -> Optional[Path]:
    base = root.joinpath(*dotted_name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if os.path.isfile(candidate):
            return candidate
    return None


def local_imports(script: Path, facts: ModuleFacts) -> list[tuple[str, Path]]:
    """The files of this checkout a script imports: `import utils`, `from util.misc import f`,
    `from .dist import setup` (resolved statically, never imported)."""
    out: list[tuple[str, Path]] = []
    roots = _import_roots(script)
    seen: set[str] = set()
    for name, _stmt in facts.imported_modules:
        if name in seen or name.split(".", 1)[0] in _NEVER_LOCAL:
            continue
        seen.add(name)
        for root in roots:
            found = _module_file(root, name)
            if found is not None:
                out.append((name, found))
                break
    package = Path(os.path.abspath(script)).parent
    for stmt in facts.relative_imports:
        base = package
        for _ in range((stmt.level or 1) - 1):
            base = base.parent
        names = [stmt.module] if stmt.module else []
        names += [f"{stmt.module}.{a.name}" if stmt.module else a.name for a in stmt.names if a.name != "*"]
        for name in names:
            found = _module_file(base, name)
            if found is not None and name not in seen:
                seen.add(name)
                out.append(("." * (stmt.level or 1) + name, found))
    return out


# Top-level names never looked for in the checkout (a local `torch/` would be a vendored copy).
_NEVER_LOCAL = frozenset({"torch", "os", "sys", "numpy", "typing", "collections", "math", "re", "json"})
