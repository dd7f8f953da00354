"""Issue 15, item 2: exactly one BOS, and the closing EOS keeps its label, on every path.

Bugs guarded (each reported in a peer trainer):

* a chat template that already emits BOS, rendered to text and tokenised again with ``add_special_tokens=True``,
  doubled the BOS — on the trainer side, and inside the engine on a text path. Guard: through the live gateway
  and the embedded engine, each call's recorded prompt starts with exactly one BOS and equals the template's
  own tokenisation, and trace-replay SFT, offline GRPO and the trainer's log-prob recomputation all use exactly
  those ids (any path that has ids sends ids, never text). The tokenizer of the ``{{ bos_token }}`` case adds
  its BOS on ``add_special_tokens=True``, so a re-tokenising path would show it twice;
* a sample that starts with the same special token twice (such a template, or such a re-tokenisation) trained
  on silently. Guard: it is rejected with an error that says what to fix; trace selection (SFT, offline GRPO)
  counts it as ``doubled start token``, the live GRPO source masks it as ``invalid`` and logs why;
* ``pad == eos`` (SmolLM2: both ``<|im_end|>``) plus a collator that masks pad ids removed the closing EOS
  label, so the model never learned to stop. Guard: every assistant turn's closing EOS keeps label / loss mask
  1 in SFT (dataset and padded collator batch) and in GRPO (TRL's loss mask), while padding stays masked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tiny_model import BOS_TEMPLATE, tiny_model

from agentforge.gateway.prefix import CONTINUED
from agentforge.testing import memory_store
from agentforge.trainers.replay.select import EmptySelectionError, TraceFilter, select_traces
from agentforge.trainers.samples import DoubledStartTokenError, build_trajectories, check_single_start
from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

AGENT = "special-tokens"
EOS = PAD = 2  # SmolLM2's <|im_end|>: eos_token_id == pad_token_id
IM_START = 1  # SmolLM2's <|im_start|>, also its bos_token
#: SmolLM2's own format with BOS written once by ``{{ bos_token }}`` and again by the first turn's header.
DOUBLED_TEMPLATE = "{{ bos_token }}" + (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class _Publisher:
    def current(self) -> str:
        return "policy@v0"

    def publish(self, adapter_dir: Path, step: int) -> str:
        return "policy@v1"


def _rollout(store, group: str, calls: list[LLMCall], reward: float) -> str:  # type: ignore[no-untyped-def]
    """A finished, scored rollout whose LLM spans are ``calls`` (engine-style ids)."""
    rollout = store.enqueue_rollout(Rollout(agent=AGENT, group_id=group, task=Task(task_id=group, input={})))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    for call in calls:
        store.add_span(Span(kind=SpanKind.llm, rollout_id=rollout.rollout_id, name="llm", llm=call))
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)
    return rollout.rollout_id


def _call(prompt: list[int], completion: list[int]) -> LLMCall:
    return LLMCall(
        version="policy@v0",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
        finish_reason="stop",
    )


# -- the ids of a SmolLM2 conversation: user turn, an answer that calls a tool, the tool's result, a final answer
USER = [
    IM_START,
    4093,
    198,
    6004,
    2,
    198,
    IM_START,
    520,
    9531,
    198,
]  # <|im_start|>user\nhi<|im_end|>\n + header
ANSWER_1 = [57, 1431, EOS]  # the sampled tool call, closed by EOS
TOOL = [
    198,
    IM_START,
    11908,
    198,
    36,
    EOS,
    198,
    IM_START,
    520,
    9531,
    198,
]  # \n + tool turn + assistant header
ANSWER_2 = [36, EOS]


def _tool_round(store, group: str, reward: float, first: list[int] | None = None) -> str:  # type: ignore[no-untyped-def]
    prompt = first or USER
    return _rollout(
        store, group, [_call(prompt, ANSWER_1), _call(prompt + ANSWER_1 + TOOL, ANSWER_2)], reward
    )


def test_a_prompt_starting_with_a_doubled_special_token_is_rejected() -> None:
    """Building samples refuses ``[BOS, BOS, ...]`` with the fix in the message; the selection counts it."""
    with pytest.raises(
        DoubledStartTokenError, match="starts with token id 1 twice.*add_special_tokens=False"
    ):
        check_single_start([IM_START, IM_START, 4093], "the prompt")
    check_single_start(USER)  # one BOS: fine
    store = memory_store()
    _tool_round(store, "good", 1.0)
    bad = _tool_round(store, "bad", 1.0, first=[IM_START, *USER])
    spans = store.list_spans(rollout_id=bad, kind=SpanKind.llm)
    with pytest.raises(DoubledStartTokenError, match=r"span .*'s prompt starts with token id 1 twice"):
        build_trajectories(spans)
    selection = select_traces(store, TraceFilter(agent=AGENT))
    assert [r.rollout.group_id for r in selection.records] == ["good"]
    assert selection.skipped["doubled start token"] == 1
    with pytest.raises(EmptySelectionError, match="add_special_tokens=True"):
        select_traces(store, TraceFilter(agent=AGENT, group_id="bad"))


def test_live_grpo_skips_a_doubled_start_token_rollout_and_says_why(caplog) -> None:
    """The live source (:class:`RolloutSource`) masks such a rollout as ``invalid`` and logs the fix once."""
    from agentforge.ports import BatchReport
    from agentforge.trainers.rollouts import RolloutSource

    store = memory_store()
    good, bad = _tool_round(store, "good", 1.0), _tool_round(store, "bad", 1.0, first=[IM_START, *USER])
    source = RolloutSource(store, {}, 2, lambda: "policy@v0")
    report = BatchReport()
    with caplog.at_level("WARNING", logger="agentforge.trainer"):
        samples, reason = source._sample(store.get_rollout(bad), 0, report)
    assert (samples, reason) == ([], "invalid")
    assert f"rollout {bad} is not trained on" in caplog.text and "add_special_tokens=True" in caplog.text
    (sample,), reason = source._sample(store.get_rollout(good), 0, report)
    assert reason is None and sample["prompt_ids"] == USER


def _eos_positions(ids: list[int], mask: list[int]) -> list[int]:
    """Positions of EOS tokens the policy sampled (mask 1): each closes an assistant turn."""
    return [i for i, (t, m) in enumerate(zip(ids, mask, strict=True)) if t == EOS and m]


def test_closing_eos_keeps_its_label_with_pad_equal_to_eos(tmp_path) -> None:
    """SFT labels (dataset and padded batch) and GRPO's loss mask keep each closing EOS; padding stays out."""
    from agentforge.trainers.replay.sft_config import ReplaySFTConfig
    from agentforge.trainers.replay.sft_trainer import ReplaySFTTrainer

    store = memory_store()
    _tool_round(store, "g", 1.0)
    _rollout(store, "g", [_call(USER, [36, 37, 38, 39, EOS])], 0.0)  # longer: the other row gets padded
    model = tiny_model()
    sft = ReplaySFTTrainer(
        model,
        store,
        TraceFilter(agent=AGENT),
        ReplaySFTConfig(
            output_dir=str(tmp_path / "sft"),
            min_reward=0.0,
            use_cpu=True,
            report_to="none",
            max_steps=1,
        ),
    )
    assert sft.trainer.processing_class.pad_token_id == sft.trainer.processing_class.eos_token_id == EOS
    rows = list(sft.trainer.train_dataset)
    for row in rows:
        mask = [int(label != -100) for label in row["labels"]]
        eos = _eos_positions(row["input_ids"], mask)
        assert eos and all(row["labels"][i] == EOS for i in eos)
    tool_round = next(r for r in rows if len(r["input_ids"]) == len(USER + ANSWER_1 + TOOL + ANSWER_2))
    sampled = [i for i, label in enumerate(tool_round["labels"]) if label != -100]
    assert [
        tool_round["input_ids"][i] for i in sampled
    ] == ANSWER_1 + ANSWER_2  # both closing EOS, no tool ids
    batch = sft.trainer.data_collator([{k: r[k] for k in ("input_ids", "labels")} for r in rows])
    for b, row in enumerate(rows):
        n = len(row["input_ids"])
        assert batch["labels"][b, :n].tolist() == row["labels"]  # EOS labels kept through the collator
        assert (batch["labels"][b, n:] == -100).all() and (batch["input_ids"][b, n:] == PAD).all()

    seen = _offline_grpo_inputs(model, store, tmp_path / "grpo", group_size=2)
    loss_rows = seen["loss"]
    by_len = {len(ids): (ids, mask) for ids, mask in loss_rows}
    ids, mask = by_len[len(ANSWER_1 + TOOL + ANSWER_2)]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == ANSWER_1 + ANSWER_2
    short_ids, short_mask = by_len[5]
    assert short_ids[-1] == EOS and short_mask[-1] == 1
    assert seen["padded_loss_positions"] == 0  # right padding (pad == eos) never counts


def _offline_grpo_inputs(model: Path, store, out: Path, group_size: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """One offline GRPO step on the store's groups; records what the log-prob passes and the loss received.

    Returns:
        ``{"logp_rows": [unpadded ids per row per log-prob call], "loss": [(completion ids, loss mask)],
        "padded_loss_positions": loss-mask 1s on padding}``.
    """
    import torch

    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.replay.grpo import StoredGroupSource

    selection = select_traces(store, TraceFilter(agent=AGENT, require_reward=False))
    config = TrainConfig(
        output_dir=str(out),
        num_generations=group_size,
        tasks_per_step=1,
        max_steps=1,
        learning_rate=1e-4,
        lora_r=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        max_completion_length=64,
        gradient_checkpointing=False,
    )
    source = StoredGroupSource(selection.groups(), group_size)
    trainer = LightningTrainer(
        model, store, None, config, _Publisher(), source=source, swap_during_training=False
    )
    grpo = trainer.trainer
    seen: dict[str, Any] = {"logp_rows": [], "loss": [], "padded_loss_positions": 0}
    logps, compute_loss = grpo._get_per_token_logps_and_entropies, grpo._compute_loss

    def record_logps(model, input_ids, attention_mask, *args, **kw):  # type: ignore[no-untyped-def]
        seen["logp_rows"].append(
            [row[m.bool()].tolist() for row, m in zip(input_ids, attention_mask, strict=True)]
        )
        return logps(model, input_ids, attention_mask, *args, **kw)

    def record_loss(model, inputs):  # type: ignore[no-untyped-def]
        mask = inputs["completion_mask"] * inputs.get("tool_mask", torch.ones_like(inputs["completion_mask"]))
        for ids, cm, lm in zip(inputs["completion_ids"], inputs["completion_mask"], mask, strict=True):
            n = int(cm.sum())
            seen["loss"].append((ids[:n].tolist(), lm[:n].tolist()))
            seen["padded_loss_positions"] += int(lm[n:].sum())
        return compute_loss(model, inputs)

    grpo._get_per_token_logps_and_entropies, grpo._compute_loss = record_logps, record_loss
    trainer.train()
    return seen


# -- the live path: agent → gateway → embedded engine → trace store → SFT / offline GRPO / log-prob passes


def _served(model: Path, template: str, tmp: Path):  # type: ignore[no-untyped-def]
    """Start the embedded engine on ``model`` with ``template`` behind a real gateway; ``(store, url, stop)``."""
    from agentforge.gateway.router import ModelRouter
    from agentforge.gateway.server import GatewayServer
    from agentforge.serving.embedded import EmbeddedServer
    from agentforge.serving.hotswap import HotSwapper

    path = tmp / "template.jinja"
    path.write_text(template)
    store, router = memory_store(), ModelRouter()
    server = EmbeddedServer(model, chat_template=path, max_lora_rank=16)
    server.start()
    HotSwapper(server, router, alias="policy").register_base()
    gateway = GatewayServer(store, router).start()

    def stop() -> None:
        gateway.stop()
        server.stop()

    return store, gateway.url, stop


def _converse(store, url: str, group: str, question: str, reward: float, max_tokens: int) -> list[tuple]:  # type: ignore[no-untyped-def]
    """One rollout through the gateway: a user message, then a tool round (the answer, the tool's result).

    Returns:
        ``(rollout_id, messages sent)`` per call, in order.
    """
    rollout = store.enqueue_rollout(Rollout(agent=AGENT, group_id=group, task=Task(task_id=group, input={})))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    messages: list[dict] = [{"role": "user", "content": question}]
    sent = []
    for _ in range(2):
        sent.append((rollout.rollout_id, list(messages)))
        body = {
            "model": "policy",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": len(sent),
        }
        reply = httpx.post(f"{url}/rollouts/{rollout.rollout_id}/v1/chat/completions", json=body, timeout=300)
        assert reply.status_code == 200, reply.text
        answer = reply.json()["choices"][0]["message"]["content"] or ""
        messages = [
            *messages,
            {"role": "assistant", "content": answer},
            {"role": "tool", "content": '{"sum": 4}'},
        ]
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)
    return sent


def _check_paths(store, model: Path, tmp: Path, template: str, bos: int, sent: list[tuple]) -> list[Span]:  # type: ignore[no-untyped-def]
    """Every call's prompt: one BOS, the template's own ids; SFT, offline GRPO and log-prob passes use them."""
    from transformers import AutoTokenizer

    from agentforge.trainers.replay.sft_config import ReplaySFTConfig
    from agentforge.trainers.replay.sft_trainer import ReplaySFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(model)
    order = {rid: i for i, (rid, _) in enumerate(sent)}
    spans = sorted(store.list_spans(kind=SpanKind.llm), key=lambda s: (order[s.rollout_id], s.sequence))
    assert len(spans) == len(sent) == 4
    previous: dict[str, list[int]] = {}
    for span, (rollout_id, messages) in zip(spans, sent, strict=True):
        prompt = span.llm.prompt_token_ids
        assert prompt[0] == bos and prompt[1] != bos, prompt[:4]  # starts with exactly one BOS
        if bos != IM_START:  # a BOS that is not also the turn header: exactly one in the whole prompt
            assert prompt.count(bos) == 1, tokenizer.decode(prompt)
        if rollout_id not in previous:  # the first call: the template's own ids, rendered once
            expected = tokenizer.apply_chat_template(
                messages, chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert prompt == list(expected), (tokenizer.decode(prompt), tokenizer.decode(expected))
        else:  # the tool round: sent as ids (previous prompt + completion + the new turns), not as text
            assert prompt[: len(previous[rollout_id])] == previous[rollout_id]
            assert CONTINUED in span.llm.flags, span.llm.flags
        previous[rollout_id] = prompt + span.llm.completion_token_ids
    trajectories = [t for r in select_traces(store, TraceFilter(agent=AGENT)).records for t in r.trajectories]
    assert len(trajectories) == 2  # one linear conversation, one trajectory
    sequences = {tuple(t.ids) for t in trajectories}
    assert sequences == {tuple(ids) for ids in previous.values()}  # the recorded ids, as they are

    sft = ReplaySFTTrainer(
        model,
        store,
        TraceFilter(agent=AGENT),
        ReplaySFTConfig(
            output_dir=str(tmp / "sft"),
            min_reward=0.0,
            use_cpu=True,
            report_to="none",
            max_steps=1,
            dedupe=False,
        ),
    )
    assert {tuple(row["input_ids"]) for row in sft.trainer.train_dataset} == sequences  # ids, never text
    seen = _offline_grpo_inputs(model, store, tmp / "grpo", group_size=2)
    passes = seen["logp_rows"]
    assert passes and all(set(map(tuple, rows)) <= sequences for rows in passes)  # old logps, policy pass
    assert all(row[0] == bos and row[1] != bos for rows in passes for row in rows)
    masks = {tuple(t.completion_ids): t.env_mask for t in trajectories}
    assert seen["loss"] and all(masks[tuple(ids)] == mask for ids, mask in seen["loss"])  # EOS included
    assert seen["padded_loss_positions"] == 0
    return spans


@pytest.mark.slow  # the embedded engine (STYLE 12's guard); a tiny model, seconds
def test_bos_template_one_bos_on_every_path(tmp_path) -> None:
    """``{{ bos_token }}`` template, a tokenizer that adds BOS when asked: one BOS from engine to trainer."""
    model = tiny_model(BOS_TEMPLATE)
    store, url, stop = _served(model, BOS_TEMPLATE, tmp_path)
    try:
        sent = [
            m
            for r, q in enumerate(["What is 2 + 2?", "Add 2 and 2."])
            for m in _converse(store, url, "g", q, float(r), max_tokens=4)
        ]
    finally:
        stop()
    _check_paths(store, model, tmp_path, BOS_TEMPLATE, bos=0, sent=sent)


@pytest.mark.slow
def test_smollm2_template_one_bos_and_closing_eos_trained(tmp_path) -> None:
    """SmolLM2-135M with its own template: one BOS everywhere, and each sampled closing EOS keeps mask 1."""
    from agentforge.config import default_model_dir
    from agentforge.model import prepare_default_model

    prepare_default_model()
    template = (default_model_dir() / "chat_template.jinja").read_text()
    store, url, stop = _served(default_model_dir(), template, tmp_path)
    try:
        questions = ["Answer in one word: what color is the sky?", "Answer in one word: what color is grass?"]
        sent = [m for r, q in enumerate(questions) for m in _converse(store, url, "g", q, float(r), 24)]
    finally:
        stop()
    spans = _check_paths(store, tiny_model(), tmp_path, template, bos=IM_START, sent=sent)
    stopped = [s for s in spans if s.llm.finish_reason == "stop"]
    assert stopped and all(s.llm.completion_token_ids[-1] == EOS for s in stopped)
    for record in select_traces(store, TraceFilter(agent=AGENT)).records:
        for traj in record.trajectories:
            closing = [i for i, t in enumerate(traj.completion_ids) if t == EOS and traj.env_mask[i]]
            assert closing, "a stopped answer's EOS is in the trajectory with mask 1"


@pytest.mark.slow  # the embedded engine; a tiny model, seconds
def test_a_template_that_doubles_bos_is_rejected_end_to_end(tmp_path) -> None:
    """A template writing BOS and then the BOS-valued turn header: the engine records it, samples refuse it."""
    model = tiny_model()
    store, url, stop = _served(model, DOUBLED_TEMPLATE, tmp_path)
    try:
        _converse(store, url, "g", "What is 2 + 2?", 1.0, max_tokens=2)
    finally:
        stop()
    assert all(
        s.llm.prompt_token_ids[:2] == [IM_START, IM_START] for s in store.list_spans(kind=SpanKind.llm)
    )
    with pytest.raises(EmptySelectionError, match="doubled start token"):
        select_traces(store, TraceFilter(agent=AGENT))
