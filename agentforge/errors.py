"""One error tree for agentforge.

``AgentForgeError`` is the root. ``UserError`` means the caller misused the API and the message says
the fix; ``RunError`` means something failed while running (a server died, a store write failed, a
rollout timed out). Modelled on pydantic-ai ``exceptions.py`` and httpx ``_exceptions.py``.
"""

from __future__ import annotations

__all__ = [
    "AgentForgeError",
    "AgentForgeWarning",
    "UserError",
    "ConfigError",
    "MissingExtraError",
    "InvalidTransitionError",
    "AdapterIncompatibleError",
    "NotFoundError",
    "RunError",
    "StoreError",
    "ServingError",
    "EngineUnreachableError",
    "UpstreamError",
    "RolloutTimeout",
]


class AgentForgeWarning(UserWarning):
    """Warnings emitted by agentforge (e.g. an unattributed gateway call stored as an orphan)."""


class AgentForgeError(Exception):
    """Root of every error agentforge raises."""


class UserError(AgentForgeError):
    """The caller misused agentforge; the message says what to change."""


class ConfigError(UserError):
    """A config value is out of range or inconsistent; the message carries the numbers."""


class MissingExtraError(UserError, ImportError):
    """An optional dependency is missing; the message names the ``pip install`` to run (``extra`` ``None``: a
    core dependency, missing from a broken install)."""

    def __init__(self, package: str, extra: str | None, purpose: str) -> None:
        self.package, self.extra = package, extra
        target = "agentforge" if extra is None else f"agentforge[{extra}]"
        missing = f"{purpose} needs the '{package}' package, which is not installed"
        super().__init__(f'{missing}. Run: pip install "{target}"')


class InvalidTransitionError(UserError):
    """A rollout or attempt was moved along an edge its state machine does not have."""


class AdapterIncompatibleError(UserError):
    """An adapter cannot be served: wrong base model or LoRA rank above the server maximum."""


class NotFoundError(UserError, KeyError):
    """An id (rollout, attempt, resource version) does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class RunError(AgentForgeError):
    """Something failed while running; retrying may succeed."""


class StoreError(RunError):
    """The trace store could not complete an operation (after its own retries)."""


class ServingError(RunError):
    """The policy server could not start, load, unload or answer."""


class EngineUnreachableError(ServingError):
    """An engine admin call got no answer at all (connection refused or reset, timed out): the engine is down or
    going down, not refusing the request; a store follower retries such a swap after the engine is back."""


class UpstreamError(RunError):
    """The inference upstream answered with an error or could not be reached.

    Attributes:
        status_code: HTTP status returned to the client (502 when the upstream was unreachable).
        body: the OpenAI-style error body (``{"error": {...}}``).
    """

    def __init__(self, message: str, status_code: int = 502, body: dict | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = body or {"error": {"message": message, "type": "upstream_error", "code": status_code}}


class RolloutTimeout(RunError):
    """A rollout attempt exceeded its time limit (seconds) or missed its heartbeat."""
