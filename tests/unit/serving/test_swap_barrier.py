"""Replicas that follow one store flip together: no replica serves a version before every replica staged it.

Each replica is a real ``HotSwapper`` + ``ModelRouter`` + ``StoreFollower`` (with a ``SwapBarrier``) over a
``FakeServer`` engine, all on one real SQLite store, as ``agentforge serve --workers N`` runs them in N
processes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from adapters import rank_adapter
from serving_helpers import FakeServer

from agentforge.errors import ConfigError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.barrier import SwapBarrier, barrier_resource
from agentforge.serving.canary import CanaryResult
from agentforge.serving.follow import StoreFollower
from agentforge.serving.hotswap import HotSwapper
from agentforge.stores.sql import SQLStore
from agentforge.trainers.publish import StorePublisher

IDS = ["r0", "r1", "r2"]


def _replica(
    store: SQLStore, replica: str, timeout_s: float = 30.0, canary: Callable[..., CanaryResult] | None = None
) -> StoreFollower:
    ok = canary or (lambda upstream: CanaryResult("ok", [1]))
    swapper = HotSwapper(FakeServer(4), ModelRouter(), canary=ok)
    swapper.register_base()
    return StoreFollower(swapper, store, barrier=SwapBarrier(store, "policy", replica, IDS, timeout_s))


def _serving(followers: list[StoreFollower]) -> list[str | None]:
    return [f.swapper.router.alias("policy") for f in followers]


def test_no_replica_flips_before_every_replica_staged_the_version(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    r0, r1, r2 = replicas = [_replica(store, r) for r in IDS]
    StorePublisher(store).publish(rank_adapter(8), step=1)

    assert r0.sync() is None and r1.sync() is None  # staged: loaded, the alias still on the base model
    assert _serving(replicas) == ["policy@v0"] * 3
    assert r0.swapper.server.loaded == ["policy@v1"] and r2.swapper.server.loaded == []
    assert r0.barrier is not None and r0.barrier.missing(1) == ["r2"]

    assert r2.sync() == "policy@v1"  # the last to stage finds every record and flips
    assert r0.sync() == "policy@v1" and r1.sync() == "policy@v1"
    assert _serving(replicas) == ["policy@v1"] * 3
    records = [
        (r.payload["replica"], r.payload["version"]) for r in store.list_resources(barrier_resource("policy"))
    ]
    assert sorted(records) == [("r0", 1), ("r1", 1), ("r2", 1)]  # one record per replica and swap
    assert store.get_resource("policy").ref == "policy@v1"  # the records never touch the alias's versions
    store.close()


def test_a_replica_that_never_stages_holds_the_others_only_until_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    r0, r1 = _replica(store, "r0", timeout_s=0.3), _replica(store, "r1", timeout_s=0.3)  # r2 is down
    StorePublisher(store).publish(rank_adapter(8), step=1)
    assert r0.sync() is None and r1.sync() is None
    time.sleep(0.35)
    with caplog.at_level(logging.WARNING, logger="agentforge.serving.barrier"):
        assert r0.sync() == "policy@v1" and r1.sync() == "policy@v1"
    assert "replicas r2 did not stage policy@v1 within 0s" in caplog.text
    store.close()


def test_a_version_one_replica_refuses_is_discarded_by_the_others(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")

    def refuse(upstream):  # type: ignore[no-untyped-def]
        raise ValueError("the canary's answer is wrong")

    r0, r1, r2 = replicas = [
        _replica(store, "r0"),
        _replica(store, "r1"),
        _replica(store, "r2", canary=refuse),
    ]
    StorePublisher(store).publish(rank_adapter(8), step=1)
    assert r0.sync() is None and r1.sync() is None and r0.swapper.server.loaded == ["policy@v1"]
    assert r2.sync() is None and r2.failed == {1}  # refused: it moves the store's active version back
    assert store.get_resource("policy").payload.get("base") is True
    for follower in (r0, r1):
        follower.sync()  # sees the version moved back: unloads what it staged, keeps serving the base
        follower.swapper.wait_drained(5)
    assert _serving(replicas) == ["policy@v0"] * 3
    assert r0.swapper.server.loaded == [] and r1.swapper.server.loaded == []
    store.close()


def test_a_barrier_needs_its_replica_in_the_set() -> None:
    with pytest.raises(ConfigError, match="must be one of"):
        SwapBarrier(None, "policy", "r9", IDS)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_s"):
        SwapBarrier(None, "policy", "r0", IDS, timeout_s=0)  # type: ignore[arg-type]


def test_a_replica_that_cannot_record_keeps_serving_and_the_others_flip_after_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from agentforge.errors import UserError

    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    r0, r1, r2 = replicas = [_replica(store, r, timeout_s=0.3) for r in IDS]

    def refused(version: int) -> None:
        raise UserError("this key may not publish resources")

    assert r0.barrier is not None
    r0.barrier.record = refused  # type: ignore[method-assign]  # a store server refusing the write
    StorePublisher(store).publish(rank_adapter(8), step=1)
    with caplog.at_level(logging.ERROR, logger="agentforge.serving.follow"):
        assert [f.sync() for f in replicas] == [None, None, None]  # r0's record is missing for everyone
    assert "could not record policy@v1 as staged" in caplog.text and r0.failed == set()
    time.sleep(0.35)
    assert [f.sync() for f in replicas] == ["policy@v1"] * 3
    store.close()
