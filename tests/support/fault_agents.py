"""An agent for the store fault tests, at module level so runner processes can import it.

``logging_agent`` writes three spans and a final reward for its attempt through the runner's store and appends
the id of every write the store acknowledged to ``$AGENTFORGE_ACK_LOG`` (one ``span <id>`` / ``reward <id>``
line each), so the test can check that nothing acknowledged was lost.
"""

from __future__ import annotations

import os
import time
from typing import Any

from agentforge.runtime import RolloutContext
from agentforge.types import Task


def _ack(kind: str, ident: str) -> None:
    with open(os.environ["AGENTFORGE_ACK_LOG"], "a", encoding="ascii") as f:
        f.write(f"{kind} {ident}\n")


def logging_agent(task: Task, ctx: RolloutContext) -> Any:
    """Three spans ``step-0..2`` (``task.input["pause_s"]`` seconds apart), then reward 1.0 (final)."""
    for step in range(3):
        span = ctx.emit_span(f"step-{step}", {"task": task.task_id, "step": step})
        _ack("span", span.span_id)
        time.sleep(float(task.input.get("pause_s", 0.1)))
    reward = ctx.emit_reward(1.0, final=True)
    _ack("reward", reward.reward_id)
    return None
