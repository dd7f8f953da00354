"""Example scripts loaded as modules (``examples/`` is not a package), for the tests that run them; above all the
example customer-service app (``examples/app/service.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SERVICE = EXAMPLES / "app" / "service.py"


def load_service(name: str = "agentforge_example_app_service") -> ModuleType:
    """Import ``examples/app/service.py`` under ``name`` (once per name; later calls return the same module)."""
    return load_example("app/service.py", name)


def load_example(path: str, name: str) -> ModuleType:
    """Import ``examples/<path>`` (say ``"tenants_job.py"``) under ``name``, once per name: later calls return the
    same module."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
