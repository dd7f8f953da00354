"""Agents for the runtime tests, at module level so spawned worker processes can import them.

Kept light (no gateway, FastAPI or uvicorn imports): every worker process imports this module.
"""

from __future__ import annotations

import time
from typing import Any

from agentforge.runtime import RolloutContext
from agentforge.types import Task


def ask(ctx: RolloutContext, messages: list[dict[str, Any]]) -> str:
    """One chat call through the gateway with the attempt's client (no SDK retries)."""
    client = ctx.openai_client(max_retries=0)
    try:
        out = client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
    finally:
        client.close()
    return out.choices[0].message.content or ""


def one_call_agent(task: Task, ctx: RolloutContext) -> float:
    """One gateway call, then reward 1.0. With ``task.input["hang"]``, the first attempt sleeps after
    its call for ``hang`` seconds (long enough to be killed or stopped)."""
    ask(ctx, [{"role": "user", "content": str(task.input.get("q", "hi"))}])
    hang = task.input.get("hang")
    if hang and (ctx.attempt_number == 1 or task.input.get("always")):
        time.sleep(float(hang))
    return 1.0


def one_call_agent_factory() -> Any:
    """A ``"module:function"`` agent factory (process workers call it once)."""
    return one_call_agent


def broken_agent_factory() -> Any:
    """A factory that cannot build its agent: worker processes exit right after starting."""
    raise RuntimeError("agent factory is broken")


def stuck_sync_agent(task: Task, ctx: RolloutContext) -> float:
    """A sync agent whose first attempt blocks far past any timeout (it cannot be cancelled)."""
    if ctx.attempt_number == 1:
        time.sleep(600)
    return 1.0
