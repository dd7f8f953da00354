"""Adapter checks, VLLMServer configuration/launch errors and HotSwapper bookkeeping, without vLLM."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from adapters import foreign_adapter, letter_adapter, rank_adapter
from serving_helpers import FakeServer

from agentforge.config import default_model_dir
from agentforge.errors import AdapterIncompatibleError, ConfigError, ServingError, UserError
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.adapters import (
    AdapterWeights,
    adapter_weights,
    check_adapter,
    check_max_lora_rank,
    read_adapter,
    same_model,
)
from agentforge.serving.base import PolicyServer
from agentforge.serving.canary import CanaryJudge
from agentforge.serving.hotswap import CanaryResult, HotSwapper
from agentforge.serving.vllm import VLLMServer


def write_config(folder: Path, **config: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", **config}))
    return folder


def test_read_adapter_rank_pattern(tmp_path: Path) -> None:
    info = read_adapter(
        write_config(
            tmp_path / "a",
            r=8,
            rank_pattern={"q_proj": 64, "v_proj": 4},
            base_model_name_or_path="/x/SmolLM2-135M-Instruct",
        )
    )
    assert (info.r, info.max_rank, info.base_model) == (8, 64, "/x/SmolLM2-135M-Instruct")


def test_read_adapter_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no adapter_config.json"):
        read_adapter(tmp_path)
    with pytest.raises(UserError, match="LoRA adapters only"):
        read_adapter(write_config(tmp_path / "ia3", peft_type="IA3"))


def test_check_adapter_messages(tmp_path: Path) -> None:
    base = str(default_model_dir())
    with pytest.raises(AdapterIncompatibleError, match=r"retrain with r<=16 .*--max-lora-rank 32"):
        check_adapter(
            write_config(tmp_path / "r32", r=32, base_model_name_or_path=base),
            base_model=base,
            max_lora_rank=16,
        )
    with pytest.raises(AdapterIncompatibleError, match=r"rank_pattern \(max 64, r=8\).*--max-lora-rank 64"):
        check_adapter(
            write_config(tmp_path / "rp", r=8, rank_pattern={"up_proj": 64}),
            base_model=base,
            max_lora_rank=16,
        )
    with pytest.raises(AdapterIncompatibleError, match="retrain the adapter on the served base model"):
        check_adapter(
            write_config(tmp_path / "f", r=8, base_model_name_or_path="org/OtherModel"),
            base_model=base,
            max_lora_rank=16,
        )
    ok = check_adapter(
        write_config(tmp_path / "ok", r=16, base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct"),
        base_model=base,
        max_lora_rank=16,
    )
    assert ok.max_rank == 16


def test_real_peft_adapters_are_read() -> None:
    assert read_adapter(rank_adapter(32)).max_rank == 32
    assert read_adapter(rank_adapter(8, rank_pattern={"q_proj": 64})).max_rank == 64
    assert same_model(read_adapter(rank_adapter(32)).base_model, default_model_dir())
    assert not same_model(read_adapter(foreign_adapter()).base_model, default_model_dir())


def test_max_lora_rank_values() -> None:
    assert check_max_lora_rank(320) == 320
    with pytest.raises(ConfigError, match="1, 8, 16, 32, 64, 128, 256, 320, 512"):
        check_max_lora_rank(24)


def test_vllm_server_config_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTFORGE_VLLM_PYTHON", str(tmp_path / "missing" / "python"))
    with pytest.raises(UserError, match="make setup"):
        VLLMServer()
    python = Path(sys.executable)
    with pytest.raises(ConfigError, match="loopback"):
        VLLMServer(python=python, host="0.0.0.0")
    with pytest.raises(ConfigError, match="accepted by vLLM"):
        VLLMServer(python=python, max_lora_rank=24)
    server = VLLMServer(python=python, port=1234, max_lora_rank=32, extra_args=["--seed", "1"])
    command = server.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-lora", "--enable-auto-tool-choice", "--chat-template", "--seed"):
        assert flag in command
    assert command[command.index("--max-lora-rank") + 1] == "32"
    assert server.base_url == "http://127.0.0.1:1234/v1"
    assert isinstance(server, PolicyServer)


def test_vllm_start_fails_fast_with_log_tail(tmp_path: Path) -> None:
    """An interpreter without vLLM exits at once: start() raises with the log tail, not after the timeout."""
    server = VLLMServer(python=Path(sys.executable), startup_timeout_s=60, log_path=tmp_path / "vllm.log")
    server.python = tmp_path / "fake-python"
    server.python.write_text("#!/bin/sh\necho 'No module named vllm' >&2\nexit 3\n")
    server.python.chmod(0o755)
    with pytest.raises(ServingError, match=r"(?s)exited with code 3.*No module named vllm"):
        server.start()
    assert not server.running
    server.stop()


def test_hotswapper_names_and_max_loras() -> None:
    router, server = ModelRouter(), FakeServer(max_loras=2)
    swapper = HotSwapper(server, router, canary=lambda upstream: CanaryResult("ok", [1]), slot_wait_s=0.3)
    assert swapper.register_base() == "policy@v0" and router.alias("policy") == "policy@v0"
    adapter = rank_adapter(8)
    assert swapper.swap(adapter) == "policy@v1"
    router.acquire("policy")  # one request in flight on v1: it cannot drain yet
    assert swapper.swap(adapter) == "policy@v2"
    with pytest.raises(ServingError, match="holds 2 adapters .* after waiting 0s for drains"):
        swapper.swap(adapter)
    router.release("policy@v1")
    assert swapper.wait_drained(5) and server.loaded == ["policy@v2"]
    assert swapper.swap(adapter, version="policy@v9") == "policy@v9"
    with pytest.raises(UserError, match="used before"):
        swapper.swap(adapter, version="policy@v1")
    assert swapper.swap(adapter) == "policy@v10"
    with pytest.raises(ConfigError):
        HotSwapper(FakeServer(max_loras=1), router)


def test_the_canary_follows_the_first_call_of_the_new_version() -> None:
    """After the flip the canary waits for the first client call of the new version (then ``canary_lag_s``), so
    that call reaches the engine first; with no call it goes after ``canary_wait_s``. Either way it runs before
    the verdict, with the alias on the new version and the version on probation."""
    router = ModelRouter()
    seen: list[tuple[str, int, bool]] = []

    def canary(upstream: Upstream) -> CanaryResult:
        version = upstream.model
        seen.append((version, router.inflight(version), router.probation(version) is not None))
        return CanaryResult("ok", [1])

    swapper = HotSwapper(FakeServer(max_loras=4), router, canary=canary, canary_wait_s=60, canary_lag_s=0)
    swapper.register_base()

    def client() -> None:
        assert router.wait_alias("policy", "policy@v0", timeout_s=60) == "policy@v1"
        router.acquire("policy")  # the gateway starts the first call of v1

    caller = threading.Thread(target=client)
    caller.start()
    assert swapper.swap(rank_adapter(8)) == "policy@v1"  # returns within 60 s only because the call came
    caller.join()
    assert seen == [("policy@v1", 1, True)]  # the call was on its way when the canary went
    router.release("policy@v1")
    quiet = HotSwapper(FakeServer(max_loras=4), router, "quiet", canary=canary, canary_wait_s=0.05)
    quiet.register_base()
    assert quiet.swap(rank_adapter(8)) == "quiet@v1" and seen[-1] == (
        "quiet@v1",
        0,
        True,
    )  # no call: it went on
    with pytest.raises(ConfigError, match="canary_wait_s=-1"):
        HotSwapper(FakeServer(max_loras=4), router, canary_wait_s=-1)


class FingerprintCanary:
    """A canary whose answer fingerprint is chosen per model name (stands in for the engine's log-probs)."""

    key = "fingerprint"

    def __init__(self, prints: dict[str, dict[str, float]]) -> None:
        self.prints, self.probed = prints, []

    def probe(self, upstream) -> CanaryResult:  # noqa: ANN001
        self.probed.append(upstream.model)
        return CanaryResult("ok", [1], fingerprint=dict(self.prints[upstream.model]), probe=self.key)

    __call__ = probe


def test_adapter_weights_digest_and_zero_lora(tmp_path: Path) -> None:
    zero, trained = adapter_weights(rank_adapter(8)), adapter_weights(letter_adapter("A"))
    assert zero.zero and not trained.zero  # untrained LoRA: B = 0, it answers exactly like the base
    copy = tmp_path / "copy"
    shutil.copytree(letter_adapter("A"), copy)
    assert adapter_weights(copy) == trained and adapter_weights(letter_adapter("B")).digest != trained.digest
    with pytest.raises(UserError, match="adapter_model"):
        adapter_weights(write_config(tmp_path / "empty", r=8))


def test_checks_and_digests_follow_rewritten_files(tmp_path: Path) -> None:
    """The remembered check and digest of an adapter directory hold only while its files are unchanged: a
    config rewritten in place with a rank above the server's is refused, new weights get a new digest."""
    base, folder = str(default_model_dir()), tmp_path / "adapter"
    shutil.copytree(letter_adapter("A"), folder)
    assert check_adapter(folder, base_model=base, max_lora_rank=16).max_rank == 8
    assert check_adapter(folder, base_model=base, max_lora_rank=16).max_rank == 8  # remembered
    before = adapter_weights(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "r": 64}))
    with pytest.raises(AdapterIncompatibleError, match="LoRA rank 64"):
        check_adapter(folder, base_model=base, max_lora_rank=16)
    shutil.copyfile(letter_adapter("B") / "adapter_model.safetensors", folder / "adapter_model.safetensors")
    assert adapter_weights(folder).digest == adapter_weights(letter_adapter("B")).digest != before.digest


def test_judge_asks_for_the_digest_only_when_the_answer_did_not_move() -> None:
    """A swap's weights are hashed beside its canary: the verdict waits for the digest only when the answer
    equals the old version's (the one case it decides), never before the canary when the old answer is known."""
    same, moved = {"t:A": -0.5}, {"t:A": -0.1}
    canary = FingerprintCanary({"policy@v1": same, "policy@v2": moved, "policy@v3": moved})
    judge, old = CanaryJudge(), Upstream(base_url="http://e", model="policy@v1")
    judge.know("policy@v1", AdapterWeights(digest="1", zero=False))
    judge.judge("policy@v1", old, canary, None, lambda: old)  # remembered: v1's answer
    asked: list[str] = []

    def pending(digest: str) -> Callable[[], AdapterWeights]:
        def wait() -> AdapterWeights:
            asked.append(digest)
            return AdapterWeights(digest=digest, zero=False)

        return wait

    judge.know("policy@v2", pending("2"))
    up2 = Upstream(base_url="http://e", model="policy@v2")
    assert judge.judge("policy@v2", up2, canary, "policy@v1", lambda: old).change == pytest.approx(0.4)
    assert asked == []  # the answer moved: the digest decides nothing, nobody waited for it
    judge.know("policy@v3", pending("3"))
    up3 = Upstream(base_url="http://e", model="policy@v3")
    with pytest.raises(ServingError, match="answers like policy@v2"):
        judge.judge("policy@v3", up3, canary, "policy@v2", lambda: up2)  # v3 answers like v2...
    assert asked == ["3", "2"]  # ...so the digests were asked for, after the canary
    assert canary.probed == ["policy@v1", "policy@v2", "policy@v3"]  # v2 was not probed again


def test_canary_refuses_changed_weights_that_answer_like_the_old_version(tmp_path: Path) -> None:
    """Weights differ but the answer's log-probs equal the old version's: refused, the old one keeps serving.
    Equal answers are accepted where no difference is known (an all-zero LoRA after the base, a copy)."""
    same, moved = {"t:A": -0.5, "t:B": -1.5}, {"t:A": -0.1, "t:B": -2.5}
    prints = {"base": same, "policy@v1": same, "policy@v2": moved, "policy@v3": moved, "policy@v4": moved}
    canary, server, router = FingerprintCanary(prints), FakeServer(max_loras=4), ModelRouter()
    swapper = HotSwapper(server, router, canary=canary)
    swapper.register_base()
    assert swapper.swap(rank_adapter(8)) == "policy@v1"  # zero LoRA: like the base, as it must be
    assert canary.probed == ["policy@v1"] and swapper.last_canary.change is None
    assert swapper.swap(letter_adapter("A")) == "policy@v2"  # compared with v1's remembered answer
    assert canary.probed == ["policy@v1", "policy@v2"] and swapper.last_canary.change == pytest.approx(1.0)
    with pytest.raises(ServingError, match="answers like policy@v2"):
        swapper.swap(letter_adapter("B"))
    assert router.alias("policy") == "policy@v2" and "policy@v3" not in server.loaded
    copy = tmp_path / "A-copy"
    shutil.copytree(letter_adapter("A"), copy)
    assert swapper.swap(copy) == "policy@v4" and swapper.last_canary.change == 0.0  # same weights: accepted

    fresh = HotSwapper(FakeServer(max_loras=4), ModelRouter(), canary=FingerprintCanary(prints))
    fresh.register_base()
    with pytest.raises(ServingError, match="answers like policy@v0"):  # base probed alongside: equal
        fresh.swap(letter_adapter("A"), version="policy@v1")
    assert sorted(fresh.canary.probed) == ["base", "policy@v1"]  # type: ignore[attr-defined]
