"""Score `ddpdoctor explain` on a graded held-out set laid out as DIR/manifest.json + DIR/cases/<id>.log.

Lenient rule (mechanical): a case is right when at least one of the manifest's `keywords` (or
`cause_keywords`) for it appears
(case-insensitive) in the text of the named root cause (title, cause, fix, reasoning) or, with no root
cause, in the lead's. It is a rough stand-in for a human grader: it cannot tell a hedged answer from a
focused one, so the strict figure is judged by hand and reported separately.

    python bench/eval_heldout.py DIR [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def named_text(report: dict) -> tuple[str, str]:
    """(id of what explain named as root cause or lead, its text)."""
    root = report.get("root_cause")
    lead = report.get("lead")
    for kind, d in (("root", root), ("lead", lead)):
        if d:
            text = " ".join(str(d.get(k, "")) for k in ("title", "cause", "fix", "reasoning"))
            return f"{kind}:{d['id']}", text
    return "-", ""


def main(argv: list[str] | None = None) -> int:
    from ddpdoctor.explain import explain, load_knowledge_base, open_log, scan_inputs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    kb = load_knowledge_base()
    rows = []
    for case in json.loads((args.dir / "manifest.json").read_text()):
        path = args.dir / "cases" / f"{case['id']}.log"
        with open_log(str(path)) as stream:
            # A neutral input name: the case id (in the file name) must not leak keywords into the reasoning.
            ex = explain(kb, scan_inputs(kb, [("input.log", stream)]))
        report = ex.to_dict()
        named, text = named_text(report)
        low = text.lower()
        # Set 2's manifest calls them `keywords`, set 3's `cause_keywords`.
        keywords = case.get("keywords") or case.get("cause_keywords") or []
        hits = [k for k in keywords if k.lower() in low]
        rows.append({"id": case["id"], "named": named, "exit": report["exit_code"], "keywords_hit": hits,
                     "lenient": bool(hits)})
    n = len(rows)
    right = sum(r["lenient"] for r in rows)
    silent = sum(r["exit"] == 0 for r in rows)
    if args.json:
        print(json.dumps({"cases": rows, "lenient_right": right, "n": n, "exit0": silent}, indent=2))
    else:
        for r in rows:
            print(f"{'right' if r['lenient'] else '-':>6} exit{r['exit']} {r['id']:<44} {r['named']}  {r['keywords_hit']}")
        print(f"{n} cases: lenient right {right} ({100 * right / n:.0f}%); exit 0: {silent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
