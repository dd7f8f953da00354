"""`agentforge versions --tenant` / `agentforge rollback --tenant`: a tenant's own lineage (policy@acme/vN)."""

from __future__ import annotations

import json
from pathlib import Path

from adapters import rank_adapter
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.stores.sql import SQLStore
from agentforge.trainers.publish import StorePublisher


def test_versions_and_rollback_of_one_tenants_lineage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    with SQLStore(url) as store:
        StorePublisher(store).publish(rank_adapter(8), step=1)  # the shared policy
        acme = StorePublisher(store, alias="policy@acme")
        assert [acme.publish(rank_adapter(8), step=s) for s in (1, 2)] == ["policy@acme/v1", "policy@acme/v2"]
        StorePublisher(store, alias="policy@bolt").publish(rank_adapter(8), step=1)
    runner = CliRunner()
    listed = runner.invoke(app, ["versions", "--tenant", "acme", "--store-url", url])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output.strip().splitlines()[-1])
    assert [(r["name"], r["version"], r["active"]) for r in rows] == [
        ("policy@acme", 1, False),
        ("policy@acme", 2, True),
    ]
    back = runner.invoke(app, ["rollback", "policy", "v1", "--tenant", "acme", "--store-url", url])
    assert back.exit_code == 0, back.output
    assert json.loads(back.output.strip().splitlines()[-1]) == {"name": "policy@acme", "active_version": 3}
    with SQLStore(url) as store:
        assert store.get_resource("policy").version == 1 and store.get_resource("policy@bolt").version == 1
        assert store.get_resource("policy@acme").payload["rollback_of"] == 1
    bad = runner.invoke(app, ["versions", "--tenant", "Not A Tenant", "--store-url", url])
    assert bad.exit_code != 0 and "tenant name" in bad.output


def test_tenant_keys_issue_list_rotate_revoke(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    SQLStore(url).close()
    runner = CliRunner()

    def run(*args: str) -> object:
        result = runner.invoke(app, ["tenants", *args, "--store-url", url])
        assert result.exit_code == 0, result.output
        return json.loads(result.output.strip().splitlines()[-1])

    key = run("issue", "acme")["key"]  # type: ignore[index]
    (listed,) = run("list")  # type: ignore[misc]
    assert listed["tenant"] == "acme" and listed["active"] and listed["key_id"] in key
    new = run("rotate", listed["key_id"])["key"]  # type: ignore[index]
    with SQLStore(url) as store:
        assert store.tenant_keys.tenant_of_key(key) is None and store.tenant_keys.tenant_of_key(new) == "acme"
    new_id = next(k["key_id"] for k in run("list", "--tenant", "acme") if k["active"])  # type: ignore[attr-defined]
    assert run("revoke", new_id)["tenant"] == "acme"  # type: ignore[index]
    assert [k["active"] for k in run("list")] == [False, False]  # type: ignore[attr-defined]
