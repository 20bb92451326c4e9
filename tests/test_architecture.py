"""The layer rule of docs/architecture.md, read from the source's own imports (`ast`, lazy ones included).

Every import points down: a module may import its own package and packages of a lower layer; packages
that share a layer do not import each other. The module graph has no cycle, and nothing but `__init__`
and `__main__` lives at the package root.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ddpdoctor"

# Bottom to top. Same number, different package: neither may import the other.
LAYERS: dict[str, int] = {
    "ddpdoctor": 0,  # the package's own __init__: version and warning filters only
    "parsers": 1,  # pure: one text format of an outside tool in, plain data out
    "edge": 2,  # every read of the outside world: processes, files, sockets, NVML, sysfs, /proc, env
    "core": 3,  # shared types, the area engine, the launch environment, the ranks-per-node judgement
    "bench": 4,
    "lint": 4,
    "explain": 4,
    "checks": 5,  # the check areas; the nccl area runs bench's smoke test
    "plan": 6,
    "cluster": 6,
    "hang": 7,  # hang --cluster runs over the cluster session
    "ci": 8,  # expect, report, prolog: CI-facing compositions of the judges
    "render": 9,
    "cli": 10,
    "dev": 11,  # docgen: reads every registry
    "__main__": 12,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports anywhere in its body (resolved to the deepest known module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            groups = [[alias.name] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import mod` names the module pkg.mod; `from mod import name` names mod itself.
            groups = [[f"{module}.{alias.name}", module] for alias in node.names]
        else:
            continue
        for group in groups:
            for candidate in group:
                while candidate and candidate not in known:
                    candidate = candidate.rpartition(".")[0]
                if candidate:
                    if candidate != name:
                        found.add(candidate)
                    break
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_room_has_a_layer() -> None:
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(LAYERS), f"rooms without a layer: {sorted(rooms - set(LAYERS))}"


def test_no_loose_module_at_the_package_root() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert not loose, f"modules at the package root: {loose}"


def test_imports_only_point_down() -> None:
    upward = []
    for module, targets in _graph().items():
        for target in targets:
            a, b = _room(module), _room(target)
            if a != b and (LAYERS[b] > LAYERS[a] or LAYERS[b] == LAYERS[a]):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


BIG_MODULE_LINES = 600


def test_big_modules_say_why_they_are_one_module() -> None:
    """A module over ~600 lines is split where a second concept lives in it, or its docstring says why not."""
    silent = []
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > BIG_MODULE_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "lines" not in doc:
                silent.append(f"{name} ({text.count(chr(10))} lines)")
    assert not silent, "modules over 600 lines without a reason in their docstring: " + ", ".join(silent)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_module_graph_has_no_cycle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected


def test_the_import_reader_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from ddpdoctor.core.model import Finding\n    import ddpdoctor.edge.runner\n"
        "from ddpdoctor.lint import a, b\n"
    )
    known = {"ddpdoctor.core.model", "ddpdoctor.edge.runner", "ddpdoctor.lint", "ddpdoctor.lint.a", "ddpdoctor.lint.b"}
    found = _imports("ddpdoctor.checks.x", source, known)
    assert found == {"ddpdoctor.core.model", "ddpdoctor.edge.runner", "ddpdoctor.lint.a", "ddpdoctor.lint.b"}
