"""Missing prerequisites skip a test on a developer's machine and fail it where they must exist.

Each prerequisite has a switch (an environment variable) that ``make test`` and CI set, so there a missing
piece is a failure, never a silent skip:

* ``AGENTFORGE_REQUIRE_DATA`` — the offline data sets (``../shared/data`` or ``$AGENTFORGE_DATA_DIR``);
* ``AGENTFORGE_REQUIRE_VLLM`` — the vLLM virtual environment (see ``fixtures_serving.py``);
* ``AGENTFORGE_REQUIRE_FRAMEWORKS`` — the framework virtual environments (``test_examples_frameworks.py``).
* ``AGENTFORGE_REQUIRE_PHOENIX`` — the Arize Phoenix environment, the OTLP receiver (``test_otlp_export_receiver.py``).
* ``AGENTFORGE_REQUIRE_HAPROXY`` — Debian's ``haproxy``, the load balancer in front of gateway replicas.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn, ParamSpec, TypeVar

import pytest

from agentforge.errors import UserError

__all__ = ["REQUIRE_DATA", "REQUIRE_VLLM", "REQUIRE_HAPROXY", "missing", "load_data", "need_haproxy"]

REQUIRE_DATA = "AGENTFORGE_REQUIRE_DATA"
REQUIRE_VLLM = "AGENTFORGE_REQUIRE_VLLM"
REQUIRE_HAPROXY = "AGENTFORGE_REQUIRE_HAPROXY"

P = ParamSpec("P")
T = TypeVar("T")


def missing(reason: str, switch: str) -> NoReturn:
    """Skip the running test because of ``reason``, or fail it when the environment variable ``switch`` is set."""
    if os.environ.get(switch):
        pytest.fail(f"{switch} is set but {reason}")
    pytest.skip(reason)


def load_data(loader: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``loader(*args, **kwargs)``; a data set that is not there (the loader's ``UserError``) skips the test,
    or fails it under ``AGENTFORGE_REQUIRE_DATA``. Any other error propagates: a broken loader fails."""
    try:
        return loader(*args, **kwargs)
    except UserError as exc:
        missing(f"the data is missing: {exc}", REQUIRE_DATA)


def need_haproxy() -> str:
    """The ``haproxy`` executable; without one the test is skipped, or failed under
    ``AGENTFORGE_REQUIRE_HAPROXY``."""
    from agentforge.scale import find_haproxy

    binary = find_haproxy()
    if binary is None:
        missing(
            "haproxy is not installed (apt-get install -y haproxy; `make setup` does it as root)",
            REQUIRE_HAPROXY,
        )
    return binary
