"""An adapter that changes nothing must not go live (issue 16): tensor keys checked against the served model.

The misfits name the right base model in their config but carry tensors for another architecture (GPT-2's
``c_attn``/``c_proj``, non-zero) or fewer modules than their config promises.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from adapters import LETTER_MESSAGES, letter_adapter, misfit_adapter, rank_adapter
from serving_helpers import ask_letter

from agentforge.config import default_model_dir
from agentforge.errors import AdapterIncompatibleError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.adapter_modules import adapter_modules, base_modules
from agentforge.serving.adapters import check_adapter
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.follow import StoreFollower
from agentforge.serving.hotswap import ChatCanary, HotSwapper
from agentforge.testing import memory_store
from agentforge.trainers.publish import StorePublisher

pytest.importorskip("peft")
pytestmark = pytest.mark.slow


def test_misfits_are_refused_with_samples_from_both_sides() -> None:
    base = default_model_dir()
    with pytest.raises(AdapterIncompatibleError) as gpt2:
        check_adapter(misfit_adapter("gpt2"), base_model=base, max_lora_rank=16)
    message = str(gpt2.value)
    assert "8 of its 8 LoRA modules are not in the served model" in message
    assert "transformer.h.0.attn.c_attn" in message and "model.layers." in message  # both sides
    assert "promises target_modules ['c_attn', 'c_proj']" in message
    with pytest.raises(AdapterIncompatibleError, match=r"promises target_modules \['v_proj'\]"):
        check_adapter(misfit_adapter("partial"), base_model=base, max_lora_rank=16)
    for good in (rank_adapter(8), letter_adapter("A")):  # real adapters of the served model pass
        assert check_adapter(good, base_model=base, max_lora_rank=16).max_rank == 8


def test_module_maps_read_from_headers() -> None:
    base = base_modules(default_model_dir())
    assert base is not None and base["model.layers.0.self_attn.q_proj"] == [576, 576]
    assert "lm_head" in base  # tied to the embedding: served although not stored
    lora = adapter_modules(rank_adapter(8))
    assert lora is not None and lora["model.layers.0.self_attn.v_proj"] == {
        "lora_A": [8, 576],
        "lora_B": [base["model.layers.0.self_attn.v_proj"][0], 8],
    }
    assert (
        base_modules("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    )  # a hub name: nothing to read, no check


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer()
    server.start()
    yield server
    server.stop()


def expect(letter: str) -> ChatCanary:
    return ChatCanary(LETTER_MESSAGES, expect=lambda text: text == letter)


def test_embedded_refuses_and_the_old_version_keeps_serving(engine: EmbeddedServer) -> None:
    router = ModelRouter()
    swapper = HotSwapper(engine, router, alias="fit")
    swapper.register_base()
    v1 = swapper.swap(letter_adapter("A"), canary=expect("A"))
    for kind in ("gpt2", "partial"):
        with pytest.raises(AdapterIncompatibleError):
            swapper.swap(misfit_adapter(kind))
        with pytest.raises(AdapterIncompatibleError):
            engine.load_adapter(f"direct-{kind}", misfit_adapter(kind))
    assert router.alias("fit") == v1 and engine.adapters() == [v1]
    upstream = router.resolve("fit")[1]
    assert ask_letter(upstream.base_url, upstream.model, api_key=upstream.api_key) == "A"
    swapper.reset_to_base()
    assert swapper.wait_drained(30)


def test_follow_never_leaves_a_refused_version_active(engine: EmbeddedServer) -> None:
    """``serve --follow``: a refused activation is moved back in the store to what is served."""
    store = memory_store()
    router = ModelRouter()
    swapper = HotSwapper(engine, router, alias="policy")
    swapper.register_base()
    publisher, follower = StorePublisher(store), StoreFollower(swapper, store)
    # Refused while the base model serves: the store's active version becomes a base-model marker.
    publisher.publish(misfit_adapter("gpt2"), step=1)
    assert follower.sync() is None and router.alias("policy") == "policy@v0"
    active = store.get_resource("policy")
    assert active.payload == {"base": True, "refused": 1} and active.version == 2
    # A good version goes live; a refused one after it leaves the store pointing at the good one.
    good = publisher.publish(letter_adapter("A"), step=2)
    assert follower.sync() == good == "policy@v3"
    publisher.publish(misfit_adapter("partial"), step=3)
    assert follower.sync() is None and router.alias("policy") == good
    assert store.get_resource("policy").ref == good
    assert [r.version for r in store.list_resources("policy") if r.active] == [3]
    assert follower.sync() is None and store.get_resource("policy").ref == good  # steady: nothing rewritten
    upstream = router.resolve("policy")[1]
    assert ask_letter(upstream.base_url, upstream.model, api_key=upstream.api_key) == "A"
    swapper.reset_to_base()
    assert swapper.wait_drained(30)
    store.close()
