"""The public API is small and explicit, and importing it is cheap (STYLE 3, 4, 16).

``agentforge.__all__`` is pinned to the module itself (as httpx's ``test_exported_members.py`` does): once
every exported name is resolved, the module's public names are exactly ``__all__``, so a name added to the
front door without being exported (or exported without existing) fails here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import agentforge
from agentforge.errors import UserError
from agentforge.open import open_store

HEAVY = ("torch", "vllm", "chromadb", "transformers", "trl", "peft", "datasets")


def _public_names(module: ModuleType) -> set[str]:
    """The module's public attributes, its submodules (set by importing them) excepted."""
    return {
        name
        for name, value in vars(module).items()
        if (not name.startswith("_") or name == "__version__") and not isinstance(value, ModuleType)
    }


def test_all_equals_the_modules_public_names_and_every_name_resolves() -> None:
    assert len(agentforge.__all__) == len(set(agentforge.__all__)), "a name is exported twice"
    for name in agentforge.__all__:
        assert getattr(agentforge, name) is not None, name
    assert set(agentforge.__all__) == _public_names(agentforge)
    assert set(agentforge.__all__) <= set(dir(agentforge))


def test_lazy_names_are_the_objects_of_their_home_modules() -> None:
    from agentforge.open import open_store as home_open_store
    from agentforge.runtime import Runner
    from agentforge.stack import LocalStack
    from agentforge.trainers.publish import rollback_adapter

    assert agentforge.open_store is home_open_store
    assert agentforge.Runner is Runner and agentforge.LocalStack is LocalStack
    assert agentforge.rollback_adapter is rollback_adapter


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        agentforge.NoSuchThing  # noqa: B018
    with pytest.raises(ImportError):
        exec("from agentforge import NoSuchThing", {})


def test_import_starts_nothing_heavy() -> None:
    code = (
        "import sys, threading, agentforge, agentforge.cli;"
        "from agentforge import Runner, LocalStack, open_store, emit_reward, TraceStore, publish_prompt;"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules];"
        "assert not heavy, heavy;"
        "assert threading.active_count() == 1, threading.enumerate()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_trainers_load_on_first_access_only() -> None:
    code = (
        "import sys, agentforge;"
        "assert 'trl' not in sys.modules;"
        "agentforge.TrainConfig;"
        "assert 'trl' in sys.modules and 'agentforge.trainers.grpo_config' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- open_store: one function from a URL to a store -----------------------------------------------------


def test_open_store_maps_each_url_kind_to_its_store(tmp_path: Path) -> None:
    from agentforge.stores.http import HTTPStore
    from agentforge.stores.sql import SQLStore

    with open_store("sqlite://") as memory:
        assert isinstance(memory, SQLStore) and memory.dialect == "sqlite"
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    with open_store(url) as file_store:
        assert isinstance(file_store, SQLStore) and file_store.url == url
    assert (tmp_path / "traces.db").is_file()
    with open_store(url, must_exist=True) as again:
        assert again.url == url
    with open_store("http://127.0.0.1:9", api_key="k") as remote:  # nothing is contacted until a call
        assert isinstance(remote, HTTPStore) and remote.base_url == "http://127.0.0.1:9"


def test_open_store_defaults_to_the_configured_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'default.db'}"
    monkeypatch.setenv("AGENTFORGE_STORE_URL", url)
    with open_store() as store:
        assert store.url == url  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "kw", "message"),
    [
        ("not a url", {}, "is not a store URL; use sqlite:///"),
        ("mysql://u@h/db", {}, "no trace store runs on 'mysql'"),
        ("sqlite:///{tmp}/missing.db", {"must_exist": True}, "no trace store at .*missing.db"),
    ],
)
def test_open_store_refuses_what_it_cannot_open(tmp_path: Path, url: str, kw: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        open_store(url.format(tmp=tmp_path), **kw)
    assert not (tmp_path / "missing.db").exists()
