"""Project-level analysis: the files linted together, and the imports between them.

`ddpdoctor lint src/` lints a project, not a pile of files: `set_epoch` is often called in a trainer
module, `set_device` and `init_process_group` in a `utils.init_distributed_mode()`, the rank-0 check in
the script that calls `save_checkpoint()` from another file. This module resolves `import utils`,
`from util import misc as utils`, `from .dist_util import setup_dist` and `import pkg.mod as m` between
the files given, statically (`ast` facts only: nothing is imported or executed), so the rules can follow
a call into the function it reaches in another file, and see who calls a function from elsewhere.

A module's names are every dotted suffix of its path (`src/pkg/utils.py` is `utils`, `pkg.utils` and
`src.pkg.utils`), because the import root (sys.path) is not known statically; a name two files share
is ambiguous and resolves to nothing.
"""

from __future__ import annotations

import ast
from pathlib import PurePath
from typing import Iterable, Optional

from ddpdoctor.lint.facts import CallSite, ModuleFacts, Scope, final_identifier

_AMBIGUOUS: ModuleFacts = None  # type: ignore[assignment]  # marks a module name two files share


def module_names(path: PurePath) -> list[str]:
    """`a/b/c.py` -> ["c", "b.c", "a.b.c"]; `a/b/__init__.py` -> ["b", "a.b"]."""
    parts = [p for p in path.with_suffix("").parts if p not in ("", ".", "..", "/") and not p.endswith(":\\")]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return [
        ".".join(parts[i:]) for i in range(len(parts) - 1, -1, -1) if all(x.isidentifier() for x in parts[i:])
    ]


def _package_of(path: PurePath) -> list[str]:
    """The package parts of a file: `a/b/c.py` -> ["a", "b"] (`a/b/__init__.py` -> ["a", "b"] as well)."""
    parts = list(path.with_suffix("").parts)
    return [p for p in parts[:-1] if p.isidentifier()]


class Project:
    """The files linted together, their module names, and the calls that cross between them."""

    def __init__(self, files: Iterable[tuple[PurePath, ModuleFacts]]) -> None:
        self.files: list[tuple[PurePath, ModuleFacts]] = list(files)
        self._called: Optional[set[str]] = None
        self._methods: Optional[dict[str, Optional[ModuleFacts]]] = None
        self.modules: dict[str, ModuleFacts] = {}
        packages: dict[str, ModuleFacts] = {}
        for path, facts in self.files:
            facts.project = self
            names = module_names(path)
            for name in names:
                known = self.modules.get(name, facts)
                self.modules[name] = facts if known is facts else _AMBIGUOUS
            if path.name == "__init__.py" and names:
                packages.setdefault(names[0], facts)
        # `import distributed` names the package distributed/, not its module distributed/distributed.py, for
        # which "distributed" is only a shorter suffix (rosinality/vq-vae-2-pytorch, held-out lint corpus 14).
        for name, facts in packages.items():
            if self.modules.get(name) is _AMBIGUOUS:
                self.modules[name] = facts
        self._relative: dict[int, dict[str, str]] = {
            id(facts): self._relative_aliases(path, facts) for path, facts in self.files
        }
        # Calls into another file's function, by (id of the callee's file, function name).
        self._callers: dict[tuple[int, str], list[tuple[ModuleFacts, CallSite]]] = {}
        self._targets: dict[int, list[tuple[ModuleFacts, Scope]]] = {}
        for _, facts in self.files:
            for cs in facts.calls:
                if cs.local:
                    continue
                found = self._resolve(facts, cs)
                if found:
                    self._targets[id(cs)] = found
                    for target, scope in found:
                        self._callers.setdefault((id(target), scope.name), []).append((facts, cs))

    @staticmethod
    def _relative_aliases(path: PurePath, facts: ModuleFacts) -> dict[str, str]:
        """Local names bound by relative imports, as dotted names under the file's own package."""
        out: dict[str, str] = {}
        package = _package_of(path)
        for stmt in facts.relative_imports:
            level = stmt.level or 0
            base = package[: len(package) - (level - 1)] if level > 1 else package
            if level - 1 > len(package):
                continue
            prefix = ".".join(base + ([stmt.module] if stmt.module else []))
            for alias in stmt.names:
                if alias.name == "*":
                    continue
                target = f"{prefix}.{alias.name}" if prefix else alias.name
                out[alias.asname or alias.name] = target
        return out

    def module(self, name: str) -> Optional[ModuleFacts]:
        found = self.modules.get(name)
        return found if found is not _AMBIGUOUS else None

    def qualified(self, facts: ModuleFacts, cs: CallSite) -> str:
        """The callee's dotted name through absolute and relative imports."""
        raw = cs.raw or ""
        head, dot, rest = raw.partition(".")
        relative = self._relative.get(id(facts), {})
        if head in relative:
            return relative[head] + dot + rest
        return cs.qual

    def _method_index(self) -> dict[str, Optional[ModuleFacts]]:
        """Method name -> the one file whose classes define it (None when several do)."""
        if self._methods is None:
            self._methods = {}
            for _, facts in self.files:
                for name in facts.methods:
                    self._methods[name] = facts if name not in self._methods else None
        return self._methods

    def _resolve(self, facts: ModuleFacts, cs: CallSite) -> list[tuple[ModuleFacts, Scope]]:
        qual = self.qualified(facts, cs)
        if "." not in qual or qual.startswith(("torch.", "os.", "self.")):
            return []
        raw = cs.raw or ""
        head = raw.split(".", 1)[0]
        if (
            raw.count(".") == 1
            and head not in facts.aliases
            and head not in self._relative.get(id(facts), {})
        ):
            # `model.save()` on an object of a class another file defines: the method, when exactly one
            # file of the project defines a method of that name (issue #24, class 7).
            owner = self._method_index().get(cs.attr)
            # ... and the object was built here from a class that file defines (`net = Net()`): a
            # method name alone is no evidence (dinov2's fvcore checkpointer has a `save` too).
            built = (
                any(
                    isinstance(v, ast.Call) and final_identifier(v) in owner.classes
                    for v, _ in facts.assigns.get(head, ())
                )
                if owner is not None
                else False
            )
            if owner is not None and built and owner is not facts and self.module(head) is None:
                return [(owner, s) for s in owner.functions.get(cs.attr, ()) if s.parent is not None]
        module, _, func = qual.rpartition(".")
        # `pkg.utils.f`: try the longest module name first; a shorter suffix may name another file.
        parts = module.split(".")
        for i in range(len(parts)):
            target = self.module(".".join(parts[i:]))
            if target is not None and target is not facts:
                scopes = [
                    s for s in target.functions.get(func, ()) if s.parent is not None and s.parent.is_module
                ]
                if not scopes:
                    return self._reexported(target, func)
                return [(target, s) for s in scopes]
        return []

    def _reexported(self, package: ModuleFacts, func: str) -> list[tuple[ModuleFacts, Scope]]:
        """`func` that a package's __init__ imports from one of its modules (`from .distributed import
        data_sampler`, rosinality's `import distributed as dist; dist.data_sampler(...)`, held-out lint corpus
        14): that module's function. One hop."""
        dotted_name = self._relative.get(id(package), {}).get(func)
        if dotted_name is None:
            return []
        module, _, name = dotted_name.rpartition(".")
        parts = module.split(".")
        for i in range(len(parts)):  # the longest module name this project knows, as _resolve does
            target = self.module(".".join(parts[i:]))
            if target is not None and target is not package:
                return [(target, s) for s in target.functions.get(name, ())
                        if s.parent is not None and s.parent.is_module]
        return []

    def callees(self, facts: ModuleFacts, cs: CallSite) -> list[tuple[ModuleFacts, Scope]]:
        """The functions in other files of the project that `cs` calls."""
        return self._targets.get(id(cs), [])

    def callers(self, facts: ModuleFacts, scope: Scope) -> list[tuple[ModuleFacts, CallSite]]:
        """Calls from other files of the project into the top-level function `scope` of `facts`."""
        return self._callers.get((id(facts), scope.name), [])

    def linked(self, facts: ModuleFacts) -> list[ModuleFacts]:
        """The files `facts` calls into, and those that call into it (one step)."""
        out: dict[int, ModuleFacts] = {}
        for cs in facts.calls:
            for target, _ in self._targets.get(id(cs), ()):
                out[id(target)] = target
        for (target_id, _name), calls in self._callers.items():
            if target_id == id(facts):
                for caller, _ in calls:
                    out[id(caller)] = caller
        out.pop(id(facts), None)
        return list(out.values())

    def any_call(self, attrs: tuple[str, ...]) -> bool:
        """Some file of the project calls one of these names (`set_epoch`, `destroy_process_group`)."""
        if self._called is None:
            # Built once: asked per file, a scan of every file each time would be quadratic.
            self._called = {cs.attr for _, facts in self.files for cs in facts.calls}
        return any(a in self._called for a in attrs)
