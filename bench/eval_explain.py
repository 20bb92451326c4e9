"""Score `ddpdoctor explain` on the evaluation set in bench/explain-eval/ (real logs from public threads).

Each case in bench/explain-eval/manifest.json names its source thread, the cause the thread established,
and the signatures that count as the right answer (plus partial and known-wrong ones), all written before
explain was run. A case is:

  right    the root cause is one of the case's `right` signatures
  partial  the root cause is a `partial` signature, or no root cause was named but a `right` signature is
           among the consequences
  wrong    any other root cause
  none     no root cause named (explain says "no cause found" or nothing matched)

It also checks that no root cause is a consequence or symptom (launcher wrappers, generic NCCL errors,
timeouts). --markdown writes bench/explain-eval/results.md, which docs/explain.md includes
(`python -m ddpdoctor.explain.docs` regenerates it).

    python bench/eval_explain.py [--json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "explain-eval"
RESULTS = ROOT / "results.md"


def score_case(case: dict, report: dict) -> tuple[str, str]:
    """(verdict, what explain named) for one case and its explain report (the --json document)."""
    root = report.get("root_cause")
    named = root["id"] if root else "-"
    cons = [d["id"] for d in report.get("consequences", [])]
    if root is not None:
        if named in case["right"]:
            return "right", named
        if named in case.get("partial", []):
            return "partial", named
        return "wrong", named
    if any(c in case["right"] for c in cons):
        return "partial", f"- (consequences: {', '.join(cons[:3])})"
    return "none", "- (no cause found)" if report.get("no_cause_found") else "-"


def run_case(case: dict) -> dict:
    from ddpdoctor.explain import explain, load_knowledge_base, open_log, scan_inputs

    kb = load_knowledge_base()
    path = ROOT / case["log"]
    with open_log(str(path)) as stream:
        ex = explain(kb, scan_inputs(kb, [(path.name, stream)]))
    report = ex.to_dict()
    verdict, named = score_case(case, report)
    role = ex.root.role if ex.root is not None else None
    return {
        "id": case["id"],
        "source": case["source"],
        "verdict": verdict,
        "named": named,
        "root_role": role,
        "consequence_as_root": role in ("consequence", "symptom"),
        "fetch_next": (report.get("no_cause_found") or {}).get("fetch_next", []),
        "held_out": not case.get("overlap"),
    }


def render_markdown(rows: list[dict], totals: dict[str, int], history: list[str]) -> str:
    n = len(rows)
    held_rows = [r for r in rows if r["held_out"]]
    held = {"n": len(held_rows), "right": sum(r["verdict"] == "right" for r in held_rows)}
    out = [
        "## Evaluation on real logs (bench/explain-eval)\n\n",
        f"{n} logs from public issue threads whose cause the thread established (source, conclusion and the "
        "expected signatures recorded in `bench/explain-eval/manifest.json` before explain was run; these "
        "logs are not test fixtures). Scored by `python bench/eval_explain.py`: **right** the root cause is "
        "the established one; **partial** a related signature, or the right one only among the consequences; "
        "**wrong** another root cause; **none** no root cause named.\n\n",
        "| right | partial | wrong | none | consequence shown as root cause |\n|---|---|---|---|---|\n",
        f"| {totals['right']} ({100 * totals['right'] // n}%) | {totals['partial']} | {totals['wrong']} | "
        f"{totals['none']} | {totals['consequence_as_root']} |\n\n",
        f"Held out (threads the knowledge base, its tests and the shared reference list had never seen): "
        f"{held['right']} of {held['n']} right. The other cases overlap with material used to write "
        "signatures (the manifest's `overlap` field says how), so their score flatters explain.\n\n",
        "".join(f"History: {h}\n\n" for h in history),
        "| case | verdict | explain named | source |\n|---|---|---|---|\n",
    ]
    for r in rows:
        held_mark = " (held out)" if r["held_out"] else ""
        out.append(f"| {r['id']}{held_mark} | {r['verdict']} | `{r['named']}` | {r['source']} |\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print every case as JSON")
    ap.add_argument("--markdown", action="store_true", help=f"write {RESULTS.relative_to(ROOT.parents[1])}")
    args = ap.parse_args(argv)
    manifest = json.loads((ROOT / "manifest.json").read_text())
    cases = manifest["cases"]
    rows = [run_case(c) for c in cases]
    totals = {k: sum(r["verdict"] == k for r in rows) for k in ("right", "partial", "wrong", "none")}
    totals["consequence_as_root"] = sum(r["consequence_as_root"] for r in rows)
    if args.json:
        print(json.dumps({"totals": totals, "cases": rows}, indent=2))
    else:
        for r in rows:
            print(f"{r['verdict']:>8}  {r['id']:<28} {r['named']}")
        n = len(rows)
        print(
            f"{n} cases: right {totals['right']} ({100 * totals['right'] / n:.0f}%), partial {totals['partial']}, "
            f"wrong {totals['wrong']}, none {totals['none']}; consequence as root cause: {totals['consequence_as_root']}"
        )
        held = [r for r in rows if r["held_out"]]
        print(f"held out: {sum(r['verdict'] == 'right' for r in held)} of {len(held)} right")
    if args.markdown:
        RESULTS.write_text(render_markdown(rows, totals, manifest.get("history", [])), encoding="utf-8")
    ok = totals["right"] >= 0.7 * len(rows) and totals["consequence_as_root"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
