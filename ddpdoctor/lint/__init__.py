"""`ddpdoctor lint`: a static checker for PyTorch DDP training scripts.

Scripts are parsed with `ast` and never imported or executed. Rules (DDP001...) live in `rules.py`
(the table, shared helpers and most rules), `device_rules.py` (which GPU a rank uses) and
`rank_rules.py` (what every rank must do alike); the walk that gathers what they judge in `facts.py`;
calls and values followed across functions and files in `flow.py`; the imports between the files
linted together in `project.py`; tiers from pyproject.toml in `config.py`; file discovery in
`discover.py`; running, `# noqa` and selection in `engine.py`. Rendering is in
`ddpdoctor/render/lint.py`.
"""

from __future__ import annotations

from ddpdoctor.lint.discover import discover_files
from ddpdoctor.lint.engine import (
    JSON_SCHEMA_VERSION,
    SYNTAX_ERROR,
    Diagnostic,
    LintReport,
    lint_file,
    lint_paths,
    lint_source,
    select_rules,
)
from ddpdoctor.lint.ruleset import RULES, Rule, default_rules

__all__ = [
    "JSON_SCHEMA_VERSION",
    "RULES",
    "SYNTAX_ERROR",
    "Diagnostic",
    "LintReport",
    "Rule",
    "default_rules",
    "discover_files",
    "lint_file",
    "lint_paths",
    "lint_source",
    "select_rules",
]
