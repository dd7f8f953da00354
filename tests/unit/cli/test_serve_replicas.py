"""``serve --workers N``'s replica set, without processes: each replica's command line and its engine's cores."""

from __future__ import annotations

import pytest

from agentforge.errors import UserError
from agentforge.scale.replicas import ServeReplicas, replica_ids


def test_each_replica_gets_the_options_its_id_and_the_sets_ids_and_no_key() -> None:
    replicas = ServeReplicas(["--backend", "embedded", "--max-model-len", "1024"], 3, 8000)
    cmd = replicas.command("r1", 9001)
    assert cmd[cmd.index("serve") :] == [
        "serve",
        "--backend",
        "embedded",
        "--max-model-len",
        "1024",
        "--host",
        "127.0.0.1",
        "--port",
        "9001",
        "--replica",
        "r1",
        "--replicas",
        "r0,r1,r2",
    ]
    assert replica_ids(2) == ["r0", "r1"]
    with pytest.raises(UserError, match="at least 2"):
        ServeReplicas([], 1, 8000)


@pytest.mark.parametrize(
    ("cores", "workers", "expected"),
    [
        ({0, 1}, 2, ["0", "1"]),  # this machine: one core per engine, not both on core 0
        (set(range(16)), 4, ["0,1,2,3", "4,5,6,7", "8,9,10,11", "12,13,14,15"]),
        ({0, 1}, 3, ["0", "1", "0"]),  # more replicas than cores: round robin
        ({2, 3, 5}, 3, ["2", "3", "5"]),  # the cores this process may use, not 0..n
    ],
)
def test_each_replicas_vllm_engine_binds_its_own_share_of_the_cores(
    monkeypatch: pytest.MonkeyPatch, cores: set[int], workers: int, expected: list[str]
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: cores)
    replicas = ServeReplicas([], workers, 8000)
    assert [replicas.cores(r) for r in replica_ids(workers)] == expected
