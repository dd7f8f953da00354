"""The agent contract, loading agents by name, and the LangGraph adapter.

**Contract.** An agent is any callable ``agent(task: Task, ctx: RolloutContext) -> Any``, sync or
``async``. Its return value is one of:

* a number: the rollout's reward (stored as a ``final`` reward, ``source="agent"``);
* a mapping with a ``"reward"`` key: the same, with that value; its other keys with number (or bool, or
  ``None``) values are the reward's named parts (``{"reward": 1.0, "db_match": 1.0, "outputs": 0.0}``),
  stored in the reward's ``metadata["parts"]`` and shown by ``agentforge traces show``; keys with other
  values are named in ``metadata["unscored_keys"]`` (and logged), never dropped without a word;
* anything else, or ``None``: no reward from the return value. The runner's ``scorer`` decides, or
  the agent recorded rewards itself (``ctx.emit_reward``).

With a ``scorer``, the scorer always decides (it is given the return value, whatever it is); it returns a
number, ``None`` or such a mapping. An
exception raised by the agent fails the attempt with its message (never a reward of 0); upstream
errors reach the agent as ``openai`` exceptions (e.g. ``BadRequestError`` for a prompt over the
context limit) and fail the attempt the same way unless the agent handles them.

**By name.** Process-mode workers build their agent from a ``"module:function"`` string (a
zero-argument factory returning the agent) or from a picklable callable (the agent itself):
:func:`load_object` and :func:`build_agent`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentforge.errors import MissingExtraError, UserError
from agentforge.types import Task

if TYPE_CHECKING:
    from openai import OpenAI

    from agentforge.runtime.context import RolloutContext

__all__ = [
    "Agent",
    "Scorer",
    "load_object",
    "build_agent",
    "LangGraphAgent",
    "reward_from_output",
    "reward_parts",
]

#: ``agent(task, ctx) -> reward | {"reward": ...} | None | Any`` (sync or async).
Agent = Callable[[Task, "RolloutContext"], Any]
#: ``scorer(task, output) -> reward | {"reward": ..., **parts}`` (``None``: no usable reward; stored as
#: invalid, never as 0).
Scorer = Callable[[Task, Any], "float | Mapping[str, Any] | None"]


def load_object(spec: str) -> Any:
    """Import ``"package.module:attribute"`` or ``"path/to/file.py:attribute"`` (the attribute may be dotted:
    ``"mod:Class.factory"``). A module is looked up on ``sys.path`` (the command line puts the current
    directory first); a ``.py`` path is loaded from that file.

    Raises:
        UserError: the string has no ``:``, or the module, file or attribute does not exist.
    """
    module_name, sep, attr = spec.rpartition(":") if spec.count(":") > 1 else spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(
            f"{spec!r} is not an import path; use 'package.module:function' or 'file.py:function'"
        )
    try:
        obj: Any = _import(module_name)
    except ImportError as exc:
        raise UserError(f"cannot import module {module_name!r} (from {spec!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})") from None
    return obj


def _import(module_name: str) -> Any:
    """A module by dotted name, or from a ``.py`` file (registered under its file stem)."""
    import importlib.util
    import sys

    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    from pathlib import Path

    path = Path(module_name).resolve()
    if not path.is_file():
        raise ImportError(f"no such file: {path}")
    name = f"agentforge_user_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def build_agent(spec: str | Callable[..., Any]) -> Callable[..., Any]:
    """Turn an agent spec into the agent callable.

    Args:
        spec: a ``"module:function"`` string naming either the agent itself (a callable taking
            ``(task, ctx)``) or a zero-argument **factory** that returns the agent; or the agent callable.

    Returns:
        The agent.

    Raises:
        UserError: the string cannot be imported, or the factory does not return a callable.
    """
    if not isinstance(spec, str):
        if not callable(spec):
            raise UserError(f"an agent must be callable as agent(task, ctx); got {type(spec).__name__}")
        return spec
    obj = load_object(spec)
    if _takes_task_and_ctx(obj):
        return obj
    if not callable(obj):
        raise UserError(
            f"{spec!r} is a {type(obj).__name__}, not an agent(task, ctx) or a factory returning one"
        )
    try:
        agent = obj()
    except Exception as exc:
        raise UserError(f"agent factory {spec!r} raised {type(exc).__name__}: {exc}") from exc
    if not callable(agent):
        raise UserError(f"agent factory {spec!r} returned {type(agent).__name__}, not a callable agent")
    return agent


def _takes_task_and_ctx(obj: Any) -> bool:
    """Whether ``obj`` can be called as ``obj(task, ctx)`` (an agent) rather than ``obj()`` (a factory)."""
    import inspect

    if not callable(obj) or isinstance(obj, type):
        return False
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    return len(required) >= 1 or any(p.kind is p.VAR_POSITIONAL for p in params) and not positional


def reward_from_output(output: Any) -> tuple[bool, float | None]:
    """``(has_reward, value)`` by the contract in the module docstring (``bool`` counts as 0/1)."""
    if isinstance(output, int | float):
        return True, float(output)
    if isinstance(output, Mapping) and "reward" in output:
        value = output["reward"]
        if value is None:
            return True, None
        if isinstance(value, int | float):
            return True, float(value)
        raise UserError(f"the agent returned reward={value!r}; a reward must be a number or None")
    return False, None


def reward_parts(output: Any) -> dict[str, Any]:
    """The reward metadata a ``{"reward": ..., **extras}`` return value carries besides its value.

    Args:
        output: an agent's return value or a scorer's result (anything; only a mapping with a ``"reward"``
            key has extras).

    Returns:
        ``{"parts": {name: float | None}}`` for extras whose values are numbers, bools (as 0.0/1.0) or
        ``None``, plus ``{"unscored_keys": [name, ...]}`` for extras of other types (their values are not
        stored: they may be large or not JSON); ``{}`` when there are no extras. NaN parts are kept as
        ``None`` (the store's JSON has no NaN).
    """
    import math

    if not isinstance(output, Mapping) or "reward" not in output:
        return {}
    parts: dict[str, float | None] = {}
    other: list[str] = []
    for key, value in output.items():
        if key == "reward":
            continue
        if value is None or isinstance(value, int | float):
            number = None if value is None else float(value)
            parts[str(key)] = None if number is None or math.isnan(number) else number
        else:
            other.append(str(key))
    return {**({"parts": parts} if parts else {}), **({"unscored_keys": other} if other else {})}


class LangGraphAgent:
    """Run an unchanged LangGraph graph as an agent, its OpenAI client pointed at the gateway.

    For each attempt: build an ``openai.OpenAI`` client with :meth:`RolloutContext.openai_client`
    (attempt header, timeout), build the graph with ``build_graph(client, ctx.resources)``, invoke it
    on ``input_fn(task)`` and return ``output_fn(final_state)``. The client is closed afterwards. An
    exception raised by the graph propagates, so the runner records the attempt as failed with it.

    The adapter is picklable (for process-mode workers) when its functions are module-level.

    Args:
        build_graph: ``(client, resources) -> compiled graph``; ``resources`` are the rollout's pinned
            versions (pick the model with ``resources.get("policy", "policy")``).
        input_fn: ``task -> graph input``; default ``task.input``.
        output_fn: ``final state -> agent return value`` (a reward, a dict with ``reward``, or
            anything for the scorer); default: the final state itself.
        config: the ``RunnableConfig`` passed to ``invoke`` (a dict, or ``(task, ctx) -> dict``, e.g.
            to set a checkpointer's ``thread_id``).
        record_tools: add a :class:`~agentforge.runtime.callbacks.ToolSpanCallback`, so every
            LangChain/LangGraph tool call becomes a ``tool`` span (observes only; the graph's state
            and checkpoints are unchanged).
        tool_output_max_chars: passed to the callback (``None``: store tool outputs whole).
        client_kwargs: extra ``openai.OpenAI`` arguments (e.g. ``max_retries=0``).
    """

    def __init__(
        self,
        build_graph: Callable[[OpenAI, dict[str, str]], Any],
        input_fn: Callable[[Task], Any] | None = None,
        output_fn: Callable[[Any], Any] | None = None,
        *,
        config: Mapping[str, Any] | Callable[[Task, RolloutContext], Mapping[str, Any]] | None = None,
        record_tools: bool = True,
        tool_output_max_chars: int | None = None,
        client_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.build_graph, self.input_fn, self.output_fn = build_graph, input_fn, output_fn
        self.config, self.record_tools = config, record_tools
        self.tool_output_max_chars = tool_output_max_chars
        self.client_kwargs = dict(client_kwargs or {})

    def __call__(self, task: Task, ctx: RolloutContext) -> Any:
        """Run the graph for one attempt (see the class docstring).

        Raises:
            MissingExtraError: ``openai`` (or, with ``record_tools``, ``langchain-core``) is missing.
            Exception: whatever the graph raises.
        """
        config = dict(self.config(task, ctx) if callable(self.config) else (self.config or {}))
        if self.record_tools:
            try:
                from agentforge.runtime.callbacks import ToolSpanCallback
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise MissingExtraError(
                    "langchain-core", "agents", "LangGraphAgent(record_tools=True)"
                ) from exc
            handler = ToolSpanCallback.for_context(ctx, max_chars=self.tool_output_max_chars)
            config["callbacks"] = _with_handler(config.get("callbacks"), handler)
        client = ctx.openai_client(**self.client_kwargs)
        try:
            graph = self.build_graph(client, dict(ctx.resources))
            state = graph.invoke(self.input_fn(task) if self.input_fn else task.input, config or None)
        finally:
            client.close()
        return self.output_fn(state) if self.output_fn else state

    def __repr__(self) -> str:
        name = getattr(self.build_graph, "__qualname__", repr(self.build_graph))
        return f"LangGraphAgent({name})"


def _with_handler(callbacks: Any, handler: Any) -> Any:
    """``callbacks`` (a list, ``None`` or a LangChain callback manager) plus ``handler``, copied."""
    if callbacks is None or isinstance(callbacks, list | tuple):
        return [*(callbacks or []), handler]
    manager = callbacks.copy()
    manager.add_handler(handler, inherit=True)
    return manager
