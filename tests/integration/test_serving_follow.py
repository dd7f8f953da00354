"""Serving follows the store: versions activated by another process are hot-swapped; failures are skipped."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from adapters import rank_adapter
from serving_helpers import FakeServer

from agentforge.errors import NotFoundError, UserError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.follow import StoreFollower
from agentforge.serving.hotswap import CanaryResult, HotSwapper
from agentforge.testing import memory_store
from agentforge.trainers.publish import StorePublisher, rollback_adapter


def _swapper() -> tuple[HotSwapper, FakeServer]:
    server = FakeServer(max_loras=4)
    swapper = HotSwapper(server, ModelRouter(), canary=lambda upstream: CanaryResult("ok", [1]))
    swapper.register_base()
    return swapper, server


def test_store_publisher_activates_and_the_follower_serves_it() -> None:
    store, (swapper, server) = memory_store(), _swapper()
    follower = StoreFollower(swapper, store)
    publisher = StorePublisher(store)
    assert publisher.current() == "policy@v0" and follower.sync() is None  # nothing published yet
    assert publisher.publish(rank_adapter(8), step=10) == "policy@v1"
    assert store.get_resource("policy").payload["step"] == 10
    assert follower.sync() == "policy@v1" and swapper.router.alias("policy") == "policy@v1"
    assert follower.sync() is None  # idempotent
    assert publisher.publish(rank_adapter(8), step=20) == "policy@v2"
    assert follower.sync() == "policy@v2" and publisher.current() == "policy@v2"
    swapper.wait_drained(5)
    assert server.loaded == ["policy@v2"]


def test_rollback_is_one_call_and_served_under_a_new_name() -> None:
    store, (swapper, _) = memory_store(), _swapper()
    follower, publisher = StoreFollower(swapper, store), StorePublisher(store)
    publisher.publish(rank_adapter(8), step=1)
    publisher.publish(rank_adapter(8), step=2)
    follower.sync()
    restored = rollback_adapter(store, "policy@v1")
    assert (
        restored.ref == "policy@v3" and restored.payload["rollback_of"] == 1 and restored.payload["step"] == 1
    )
    assert follower.sync() == "policy@v3"
    base = rollback_adapter(store, 0)
    assert follower.sync() == "policy@v0" and base.payload["base"] is True
    with pytest.raises(NotFoundError):
        rollback_adapter(store, 9)
    with pytest.raises(UserError, match="version number"):
        rollback_adapter(store, "latest")


def test_a_version_that_cannot_load_is_logged_once_and_the_old_one_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, (swapper, _) = memory_store(), _swapper()
    follower, publisher = StoreFollower(swapper, store), StorePublisher(store)
    publisher.publish(rank_adapter(8), step=1)
    follower.sync()
    bad = tmp_path / "adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((rank_adapter(32) / "adapter_config.json").read_text())
    (bad / "adapter_model.safetensors").write_bytes(b"")
    from agentforge.types import ResourceVersion

    store.publish_resource(ResourceVersion(name="policy", kind="adapter", payload={"path": str(bad)}))
    with caplog.at_level(logging.ERROR, logger="agentforge.serving.follow"):
        assert follower.sync() is None and follower.sync() is None
    assert swapper.router.alias("policy") == "policy@v1" and follower.failed == {2}
    assert len([r for r in caplog.records if "cannot serve policy@v2" in r.getMessage()]) == 1
    publisher.publish(rank_adapter(8), step=3)  # a newer version is tried again
    assert follower.sync() == "policy@v3"


def test_the_follower_thread_picks_versions_up(tmp_path: Path) -> None:
    store, (swapper, _) = memory_store(), _swapper()
    with StoreFollower(swapper, store, poll_s=0.05):
        StorePublisher(store).publish(rank_adapter(8), step=1)
        import time

        deadline = time.monotonic() + 10
        while swapper.router.alias("policy") != "policy@v1" and time.monotonic() < deadline:
            time.sleep(0.05)
    assert swapper.router.alias("policy") == "policy@v1"


@pytest.mark.vllm
def test_real_vllm_follows_a_version_published_elsewhere_and_a_rollback(
    vllm_server, serving_router, serving_gateway, letter_adapters, unique_alias
) -> None:  # type: ignore[no-untyped-def]
    """A job in another process publishes "A" then "B" to the store; serving follows; a rollback brings A back."""
    from serving_helpers import ask_letter, new_rollout

    from agentforge.serving.hotswap import ChatCanary, HotSwapper

    swapper = HotSwapper(vllm_server, serving_router, unique_alias, drain_timeout_s=60)
    swapper.register_base()
    store = serving_gateway.store
    publisher, follower = StorePublisher(store, alias=unique_alias), StoreFollower(swapper, store)
    url = f"{serving_gateway.url}/rollouts/{new_rollout(serving_gateway)}/v1"
    try:
        publisher.publish(letter_adapters["A"], step=1)
        assert follower.sync() == f"{unique_alias}@v1" and ask_letter(url, unique_alias) == "A"
        publisher.publish(letter_adapters["B"], step=2)
        assert follower.sync() == f"{unique_alias}@v2" and ask_letter(url, unique_alias) == "B"
        rollback_adapter(store, 1, alias=unique_alias)
        assert follower.sync() == f"{unique_alias}@v3" and ask_letter(url, unique_alias) == "A"
        assert swapper.last_canary is not None and not isinstance(swapper.last_canary, ChatCanary)
    finally:
        swapper.wait_drained(60)
        for version in swapper.live_versions():
            vllm_server.unload_adapter(version)
