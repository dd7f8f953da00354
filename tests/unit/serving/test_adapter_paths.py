"""Adapter paths in the store are absolute, and the store never names active a version serving could not load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from adapters import rank_adapter
from serving_helpers import FakeServer
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.gateway.router import ModelRouter
from agentforge.serving.adapters import read_adapter
from agentforge.serving.follow import StoreFollower
from agentforge.serving.hotswap import CanaryResult, HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.stores.sql import SQLStore
from agentforge.types import ResourceVersion


def _swapper() -> HotSwapper:
    swapper = HotSwapper(FakeServer(4), ModelRouter(), canary=lambda upstream: CanaryResult("ok", [1]))
    swapper.register_base()
    return swapper


def test_an_adapter_published_by_a_relative_path_is_stored_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "trainer-cwd"
    shutil.copytree(rank_adapter(8), run / "runs" / "train" / "adapters" / "step-2")
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    monkeypatch.chdir(run)  # as `agentforge train --output-dir runs/train` saves them
    version = HotSwapPublisher(_swapper(), store).publish(Path("runs/train/adapters/step-2"), step=2)
    stored = store.get_resource("policy").payload["path"]
    assert version == "policy@v1" and stored == str((run / "runs/train/adapters/step-2").resolve())

    elsewhere = tmp_path / "serve-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # `agentforge serve` started from another directory
    assert read_adapter(stored).max_rank == 8
    follower = StoreFollower(_swapper(), store)
    assert follower.sync() == "policy@v1" and not follower.failed
    store.close()


def test_versions_never_shows_active_a_version_serving_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url)
    store.publish_resource(  # an old record: a path relative to wherever training ran
        ResourceVersion(name="policy", kind="adapter", payload={"path": "runs/train/adapters/step-5"})
    )
    follower = StoreFollower(_swapper(), store)
    assert follower.sync() is None and follower.failed == {1}
    result = CliRunner().invoke(app, ["versions", "policy", "--store-url", url])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [v["version"] for v in listed if v["active"]] == [2]  # the base model that serves, not v1
    assert store.get_resource("policy").payload == {"base": True, "refused": 1}
    store.close()


def test_a_resource_that_is_not_an_adapter_is_refused_by_name_of_its_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An admin may store any kind under the alias (``other`` with an ``adapter_path`` of its own, say):
    serving refuses it saying why, keeps serving what it served, and the store does not name it active."""
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    store.publish_resource(
        ResourceVersion(name="policy", kind="other", payload={"adapter_path": str(rank_adapter(8))})
    )
    follower = StoreFollower(_swapper(), store)
    with caplog.at_level("ERROR", logger="agentforge.serving.follow"):
        assert follower.sync() is None and follower.failed == {1}
    assert "policy@v1 is a resource of kind 'other'; serving follows adapter versions only" in caplog.text
    assert store.get_resource("policy").payload == {"base": True, "refused": 1}
    store.close()
