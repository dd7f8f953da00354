"""Adapter checks, VLLMServer configuration/launch errors and HotSwapper bookkeeping, without vLLM."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from adapters import foreign_adapter, letter_adapter, rank_adapter
from serving_helpers import FakeServer

from agentforge.config import default_model_dir
from agentforge.errors import AdapterIncompatibleError, ConfigError, ServingError, UserError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.adapters import (
    adapter_weights,
    check_adapter,
    check_max_lora_rank,
    read_adapter,
    same_model,
)
from agentforge.serving.base import PolicyServer
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
