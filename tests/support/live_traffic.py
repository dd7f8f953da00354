"""Live traffic for promotion tests: client threads running one-call rollouts through a real gateway and scoring them.

Each client, until stopped, enqueues an unpinned rollout (of its tenant, if any), asks the gateway once within it,
stores ``score(client, answer)`` as the rollout's final reward and marks it succeeded. Every non-200 answer or
transport error is a failed request (``failed``); the promotion gate must never cause one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from agentforge.ports import TraceStore
from agentforge.types import Reward, Rollout, RolloutState


class LiveTraffic:
    """``clients`` threads of live rollouts (module docstring); a context manager that starts and stops them.

    Args:
        store: the store the gateway writes to.
        clients: client threads.
        ask: ``ask(client, rollout_id) -> response`` of one chat completion through the gateway.
        score: ``score(client, answer) -> reward`` of the answer's text.
        tenant: ``tenant(client)``: the tenant whose rollouts the client runs (``None``: no tenant).

    Attributes:
        ok: rollouts finished per tenant (``None`` for no tenant); failed: what each failed request got.
    """

    def __init__(
        self,
        store: TraceStore,
        clients: int,
        ask: Callable[[int, str], httpx.Response],
        score: Callable[[int, str], float],
        tenant: Callable[[int], str | None] = lambda client: None,
    ) -> None:
        self.store, self.ask, self.score, self.tenant = store, ask, score, tenant
        self.ok: dict[str | None, int] = {tenant(i): 0 for i in range(clients)}
        self.failed: list[str] = []
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)
        ]

    def __enter__(self) -> LiveTraffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(180)

    def wait(self, more: int, tenant: str | None = None) -> None:
        """Block until ``tenant``'s clients finished ``more`` further rollouts."""
        target = self.ok[tenant] + more
        while self.ok[tenant] < target:
            threading.Event().wait(0.2)

    def _client(self, i: int) -> None:
        tenant = self.tenant(i)
        while not self._stop.is_set():
            rollout = self.store.enqueue_rollout(Rollout(tenant=tenant))
            self.store.update_rollout(rollout.rollout_id, state=RolloutState.running)
            try:
                response = self.ask(i, rollout.rollout_id)
            except httpx.HTTPError as exc:
                with self._lock:
                    self.failed.append(repr(exc))
                continue
            if response.status_code != 200:
                with self._lock:
                    self.failed.append(f"{tenant} {response.status_code}: {response.text[:200]}")
                continue
            answer = response.json()["choices"][0]["message"]["content"].strip()
            self.store.add_reward(
                Reward(rollout_id=rollout.rollout_id, value=self.score(i, answer), final=True)
            )
            self.store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)
            with self._lock:
                self.ok[tenant] += 1
