"""Check areas: one module per area, each exposing `AREA` (an engine.Area).

Modules are discovered, so adding an area is adding a module.
"""

from __future__ import annotations

import importlib
import pkgutil

from ddpdoctor.core.engine import Area


def load_areas() -> list[Area]:
    areas: list[Area] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        area = getattr(module, "AREA", None)
        if isinstance(area, Area):
            areas.append(area)
    return sorted(areas, key=lambda a: (a.order, a.name))
