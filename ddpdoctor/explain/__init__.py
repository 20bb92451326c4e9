"""`ddpdoctor explain`: the root cause of a failed distributed run, from its logs.

kb.py loads the signature knowledge base (ddpdoctor/data/signatures.json), normalize.py reads rank, host
and time off a line, scan.py streams the logs through a prefilter in bounded memory, reason.py picks the
root cause and its consequences. Rendering lives in ddpdoctor/render/explain.py.
"""

from __future__ import annotations

from ddpdoctor.explain.kb import KnowledgeBase, Signature, load_knowledge_base
from ddpdoctor.explain.reason import Diagnosis, Explanation, explain
from ddpdoctor.explain.scan import ScanResult, open_log, scan_inputs

__all__ = [
    "Diagnosis",
    "Explanation",
    "KnowledgeBase",
    "ScanResult",
    "Signature",
    "explain",
    "load_knowledge_base",
    "open_log",
    "scan_inputs",
]
