"""A rollout's pinned policy version is what serves its calls, even after the alias flips."""

from __future__ import annotations

from gateway_helpers import CHAT

from agentforge.gateway.app import create_gateway
from agentforge.testing import ScriptedUpstream
from agentforge.types import Rollout


async def test_pinned_rollout_is_served_by_its_version_after_the_alias_moves(gw_store, gw_client_for) -> None:
    upstream = ScriptedUpstream(["one", "two", "three"])
    router = upstream.router("policy", "policy@v1")
    router.register("policy@v2", upstream.upstream())
    router.set_alias("policy", "policy@v2")
    pinned = gw_store.enqueue_rollout(Rollout(resources={"policy": "policy@v1"}))
    free = gw_store.enqueue_rollout(Rollout())
    client = gw_client_for(create_gateway(gw_store, router, transport=upstream.transport()))

    assert (
        await client.post(f"/rollouts/{pinned.rollout_id}/v1/chat/completions", json=CHAT)
    ).status_code == 200
    assert (
        await client.post(f"/rollouts/{free.rollout_id}/v1/chat/completions", json=CHAT)
    ).status_code == 200
    assert gw_store.list_spans(rollout_id=pinned.rollout_id)[0].llm.version == "policy@v1"
    assert gw_store.list_spans(rollout_id=free.rollout_id)[0].llm.version == "policy@v2"

    router.set_alias("policy", "policy@v1")  # a pin to a version that is gone falls back to the alias
    router.drain("policy@v2", timeout_s=1)
    gone = gw_store.enqueue_rollout(Rollout(resources={"policy": "policy@v2"}))
    assert (
        await client.post(f"/rollouts/{gone.rollout_id}/v1/chat/completions", json=CHAT)
    ).status_code == 200
    assert gw_store.list_spans(rollout_id=gone.rollout_id)[0].llm.version == "policy@v1"
