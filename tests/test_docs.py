"""docs/checks.md and docs/snapshot.md are generated from the code; keep them in sync."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.dev import docgen

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("name", sorted(docgen.GENERATED))
def test_generated_docs_are_current(name: str) -> None:
    expected = docgen.GENERATED[name]()
    actual = (DOCS / name).read_text()
    assert actual == expected, f"docs/{name} is stale: run `python -m ddpdoctor.dev.docgen`"


def test_every_finding_id_is_documented() -> None:
    from ddpdoctor.checks import load_areas
    from ddpdoctor.core.model import all_specs

    load_areas()
    text = (DOCS / "checks.md").read_text()
    for spec_id in all_specs():
        if not spec_id.startswith("test."):
            assert f"`{spec_id}`" in text


def test_docgen_writes_the_repository_docs_folder() -> None:
    # `make docs` (python -m ddpdoctor.dev.docgen) must write docs/, not a folder beside its own module.
    assert docgen.DOCS == Path(__file__).resolve().parent.parent / "docs"
