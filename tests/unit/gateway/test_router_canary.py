"""The router's traffic canary: a share of rollouts, sticky by rollout id, routed to a candidate version."""

from __future__ import annotations

import pytest

from agentforge.errors import NotFoundError
from agentforge.gateway.pins import PinCache
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.testing import memory_store
from agentforge.types import Rollout, new_id


def router() -> ModelRouter:
    r = ModelRouter()
    for v in ("policy@v1", "policy@v2"):
        r.register(v, Upstream("http://127.0.0.1:1/v1", v))
    r.set_alias("policy", "policy@v1")
    return r


def test_canary_share_is_sticky_by_rollout_and_ends_cleanly() -> None:
    r = router()
    ids = [new_id("ro") for _ in range(2000)]
    assert all(r.canary_target("policy", i) is None for i in ids)  # no canary: nobody is diverted
    r.set_canary("policy", "policy@v2", 0.25)
    chosen = {i for i in ids if r.canary_target("policy", i) == "policy@v2"}
    assert 0.2 < len(chosen) / len(ids) < 0.3
    assert chosen == {i for i in ids if r.canary_target("policy", i) == "policy@v2"}  # sticky
    assert r.canary_target("other", ids[0]) is None and r.alias("policy") == "policy@v1"
    r.clear_canary("policy")
    assert all(r.canary_target("policy", i) is None for i in chosen)
    with pytest.raises(NotFoundError):
        r.set_canary("policy", "policy@v9", 0.5)
    with pytest.raises(ValueError, match="share 1.0"):
        r.set_canary("policy", "policy@v2", 1.0)


def test_pins_send_unpinned_rollouts_in_the_share_to_the_canary() -> None:
    store, r = memory_store(), router()
    pins = PinCache(store, r)
    r.set_canary("policy", "policy@v2", 0.5)
    unpinned = [store.enqueue_rollout(Rollout()).rollout_id for _ in range(200)]
    targets = [pins.target(i, "policy") for i in unpinned]
    assert set(targets) == {"policy", "policy@v2"}
    assert targets == [pins.target(i, "policy") for i in unpinned]  # every call of a rollout alike
    pinned = store.enqueue_rollout(Rollout(resources={"policy": "policy@v1"})).rollout_id
    assert all(pins.target(pinned, "policy") == "policy@v1" for _ in range(3))  # a pin always wins
    store.close()
