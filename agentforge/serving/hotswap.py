"""Hot-swapping LoRA adapter versions behind a model alias without failing a request.

One swap (DESIGN.md, facts 2 and 3)::

    validate (base model, rank)  →  load under a NEW name policy@vN  →  register policy@vN in the router
    →  canary request to policy@vN  →  flip alias policy → policy@vN
    →  background: router.drain(old) (waits for its in-flight requests)  →  unload old

Any failure before the flip leaves the old version serving and propagates; the new version is removed
again. The alias flip is one dictionary write under the router's lock, so a request resolves either to
the old version (and finishes there) or to the new one — never to an unloaded adapter.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentforge.errors import AgentForgeError, ConfigError, ServingError, UserError
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.adapters import check_adapter
from agentforge.serving.base import PolicyServer

__all__ = ["Canary", "CanaryResult", "ChatCanary", "HotSwapper"]

log = logging.getLogger(__name__)


@dataclass
class CanaryResult:
    """What a canary request got back.

    Attributes:
        text: the assistant text.
        token_ids: completion token ids returned by the engine.
        latency_s: seconds the request took.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    latency_s: float = 0.0


#: A canary gets the upstream of the new version and raises (anything) if the version must not serve.
Canary = Callable[[Upstream], CanaryResult]


class ChatCanary:
    """Default canary: one short greedy chat completion that must return non-empty token ids.

    Args:
        messages: the chat messages to send.
        expect: optional check of the answer text; a false result fails the canary.
        max_tokens: completion length limit (tokens).
        timeout_s: request timeout (seconds).
    """

    def __init__(
        self,
        messages: Sequence[dict[str, Any]] = ({"role": "user", "content": "Say OK."},),
        *,
        expect: Callable[[str], bool] | None = None,
        max_tokens: int = 8,
        timeout_s: float = 120.0,
    ) -> None:
        self.messages, self.expect = list(messages), expect
        self.max_tokens, self.timeout_s = max_tokens, timeout_s

    def __call__(self, upstream: Upstream) -> CanaryResult:
        """Send the request to ``upstream``.

        Raises:
            ServingError: the request failed, returned no token ids, or ``expect`` rejected the text.
        """
        body = {
            "model": upstream.model,
            "messages": self.messages,
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "logprobs": True,
            "return_token_ids": True,
        }
        headers = {"Authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        t0 = time.monotonic()
        try:
            response = httpx.post(
                f"{upstream.base_url}/chat/completions", json=body, headers=headers, timeout=self.timeout_s
            )
        except httpx.HTTPError as exc:
            raise ServingError(f"canary request to {upstream.model!r} failed: {exc!r}") from exc
        if response.status_code != 200:
            raise ServingError(
                f"canary request to {upstream.model!r} answered {response.status_code}: {response.text[:300]}"
            )
        choice = response.json()["choices"][0]
        result = CanaryResult(
            text=choice["message"].get("content") or "",
            token_ids=choice.get("token_ids") or [],
            latency_s=time.monotonic() - t0,
        )
        if not result.token_ids:
            raise ServingError(f"canary answer of {upstream.model!r} carries no token ids: {choice}")
        if self.expect is not None and not self.expect(result.text):
            raise ServingError(
                f"canary answer of {upstream.model!r} was rejected by expect(): {result.text!r}"
            )
        return result


class HotSwapper:
    """Loads adapter versions into a :class:`PolicyServer` and moves a router alias onto them.

    Args:
        server: the engine (started).
        router: the gateway's router.
        alias: the alias clients use (``policy``); versions are named ``{alias}@v{N}``.
        canary: the check a new version must pass before the flip (default :class:`ChatCanary`).
        drain_timeout_s: seconds to wait for an old version's in-flight requests before giving up on it
            (it then stays loaded and the failure is kept in :attr:`errors`).

    Raises:
        ConfigError: the server's ``max_loras`` is below 2.
    """

    def __init__(
        self,
        server: PolicyServer,
        router: ModelRouter,
        alias: str = "policy",
        *,
        canary: Canary | None = None,
        drain_timeout_s: float = 120.0,
    ) -> None:
        self.server, self.router, self.alias = server, router, alias
        self.canary: Canary = canary or ChatCanary()
        self.drain_timeout_s = drain_timeout_s
        self.max_loras: int | None = getattr(server, "max_loras", None)
        if self.max_loras is not None and self.max_loras < 2:
            raise ConfigError(f"max_loras={self.max_loras}: a hot swap needs at least 2 (old + new version)")
        self.errors: list[BaseException] = []  # background drain/unload failures
        self.last_canary: CanaryResult | None = None
        self._lock = threading.Lock()  # one swap at a time
        self._state = threading.Lock()  # guards the fields below
        self._used: set[str] = set()
        self._live: set[str] = set()  # adapter versions loaded by this swapper and not yet unloaded
        self._drains: list[threading.Thread] = []

    @property
    def base_version(self) -> str:
        """The version name serving the base model (``{alias}@v0``)."""
        return f"{self.alias}@v0"

    def register_base(self) -> str:
        """Register ``{alias}@v0`` → the base model and point the alias at it if it points nowhere.

        The base version is never unloaded (the engine always serves its base weights).

        Returns:
            ``{alias}@v0``.
        """
        name = self.base_version
        self.router.register(name, Upstream(base_url=self.server.base_url, model=self.server.base_model_name))
        with self._state:
            self._used.add(name)
        if self.router.alias(self.alias) is None:
            self.router.set_alias(self.alias, name)
        return name

    def live_versions(self) -> list[str]:
        """Adapter versions loaded by this swapper and not yet unloaded (active and draining)."""
        with self._state:
            return sorted(self._live)

    def swap(
        self, adapter_path: str | Path, version: str | None = None, *, canary: Canary | None = None
    ) -> str:
        """Serve the adapter at ``adapter_path`` as a new version and move the alias onto it.

        Blocks until the new version serves through the alias (seconds: load ≈ 0.05 + canary); the old
        version drains and unloads in the background (see :meth:`wait_drained`).

        Args:
            adapter_path: PEFT adapter directory.
            version: the new version name (``policy@v8``; default: the next unused number).
            canary: a check for this swap only (default: the swapper's).

        Returns:
            The new version name.

        Raises:
            UserError: ``version`` was used before or does not belong to the alias.
            AdapterIncompatibleError: base model or rank do not fit the server (nothing was loaded).
            ServingError: too many versions in flight for ``--max-loras``, the load failed, or the canary
                failed; the old version keeps serving in every case.
        """
        with self._lock:
            check_adapter(
                adapter_path, base_model=self.server.base_model, max_lora_rank=self.server.max_lora_rank
            )
            name = self._new_name(version)
            live = self.live_versions()
            if self.max_loras is not None and len(live) + 1 > self.max_loras:
                raise ServingError(
                    f"--max-loras {self.max_loras} is too small for {len(live)} versions in flight "
                    f"({', '.join(live)}) plus {name}; wait for drains (HotSwapper.wait_drained()) or "
                    f"restart the server with --max-loras {len(live) + 2}"
                )
            self.server.load_adapter(name, str(adapter_path))
            with self._state:
                self._used.add(name)
                self._live.add(name)
            upstream = Upstream(base_url=self.server.base_url, model=name)
            self.router.register(name, upstream)
            try:
                self.last_canary = (canary or self.canary)(upstream)
            except BaseException as exc:
                self._retire(name)
                if isinstance(exc, AgentForgeError):
                    raise
                raise ServingError(
                    f"canary for {name} failed: {exc!r}; the old version keeps serving"
                ) from exc
            old = self.router.set_alias(self.alias, name)
            log.info("alias %s → %s (was %s)", self.alias, name, old)
            if old is not None and old != name and old != self.base_version:
                self._drain_in_background(old)
            return name

    def reset_to_base(self) -> str:
        """Point the alias back at the base model (``{alias}@v0``); the old version drains and unloads.

        Returns:
            ``{alias}@v0``.
        """
        with self._lock:
            base = self.register_base()
            old = self.router.set_alias(self.alias, base)
            if old is not None and old != base:
                self._drain_in_background(old)
            return base

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        """Wait for background drains to finish; True when none is left running."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in list(self._drains):
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._drains = [t for t in self._drains if t.is_alive()]
        return not self._drains

    def _new_name(self, version: str | None) -> str:
        with self._state:
            used = self._used | set(self.server.adapters())
            if version is None:
                numbers = [
                    int(m.group(1))
                    for v in used
                    if (m := re.fullmatch(rf"{re.escape(self.alias)}@v(\d+)", v))
                ]
                return f"{self.alias}@v{max(numbers, default=0) + 1}"
        if not version.startswith(f"{self.alias}@"):
            raise UserError(f"version {version!r} must be named {self.alias}@<version>, e.g. {self.alias}@v8")
        if version in used:
            raise UserError(
                f"version name {version!r} was used before; every adapter version needs a new name"
            )
        return version

    def _drain_in_background(self, version: str) -> None:
        thread = threading.Thread(target=self._drain, args=(version,), name=f"drain-{version}", daemon=True)
        thread.start()
        self._drains.append(thread)

    def _drain(self, version: str) -> None:
        try:
            self.router.drain(version, timeout_s=self.drain_timeout_s)
            self._retire(version, drained=True)
        except BaseException as exc:  # kept for the caller; the thread must not die silently
            log.warning("could not retire %s: %s", version, exc)
            self.errors.append(exc)

    def _retire(self, version: str, drained: bool = False) -> None:
        """Unregister (if not drained yet) and unload ``version``; it must not be the alias target."""
        if not drained:
            self.router.drain(version, timeout_s=self.drain_timeout_s)
        try:
            self.server.unload_adapter(version)
        finally:
            with self._state:
                self._live.discard(version)
