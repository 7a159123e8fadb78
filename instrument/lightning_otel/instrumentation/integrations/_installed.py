"""Is a library installed? Checked without importing it: an import can be slow or have side effects
(LiteLLM fetches a price list from the internet when imported)."""

from __future__ import annotations

import importlib.util


def installed(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(module) is not None for module in modules)
    except (ImportError, ValueError):
        return False
