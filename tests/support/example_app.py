"""The example customer-service app (``examples/app/service.py``) loaded as a module, for the tests that run it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SERVICE = Path(__file__).resolve().parents[2] / "examples" / "app" / "service.py"


def load_service(name: str = "agentforge_example_app_service") -> ModuleType:
    """Import ``examples/app/service.py`` under ``name`` (once per name; later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SERVICE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
