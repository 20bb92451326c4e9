"""GPU generations told from the model name, for when NVML or nvidia-smi does not say.

NVML's nvmlDeviceGetArchitecture and `nvidia-smi -q`'s "Product Architecture" are the sources of truth;
snapshots from before ddpdoctor read them, and drivers before R450, only carry the name.
"""

from __future__ import annotations

import re
from typing import Optional

_GENERATIONS = (
    ("blackwell", re.compile(r"\b(GB|B)(100|200|300)\b|RTX (PRO )?50\d0|RTX PRO 6000 Blackwell", re.I)),
    ("hopper", re.compile(r"\b(GH|H)(100|200|800|20)\b", re.I)),
    ("ada", re.compile(r"\bL(4|20|40S?)\b|RTX 40\d0|RTX \d000 Ada", re.I)),
    ("ampere", re.compile(r"\bA(2|10G?|16|30|40|100|800|\d000)\b|RTX 30\d0", re.I)),
    ("turing", re.compile(r"\bT4\b|RTX 20\d0|Quadro RTX|TITAN RTX", re.I)),
    ("volta", re.compile(r"\bV100\b|TITAN V", re.I)),
)
# The names NVML gives the same generations (ddpdoctor.edge.nvml.ARCHITECTURES).
ARCHITECTURE_NAMES = {
    "blackwell": "Blackwell",
    "hopper": "Hopper",
    "ada": "Ada Lovelace",
    "ampere": "Ampere",
    "turing": "Turing",
    "volta": "Volta",
}


def gpu_generation(name: Optional[str]) -> str:
    """`NVIDIA H100 80GB HBM3` -> `hopper`; `unknown` when the name matches no known generation."""
    for generation, pattern in _GENERATIONS:
        if name and pattern.search(name):
            return generation
    return "unknown"


def describe_architecture(architecture: Optional[str], name: Optional[str]) -> str:
    """The architecture as read, else the one the model name implies (marked so), else 'unknown architecture'."""
    if architecture:
        return architecture
    derived = ARCHITECTURE_NAMES.get(gpu_generation(name))
    return f"{derived}, from the name" if derived else "unknown architecture"
