"""Credit by reward part and by span: the act call's tokens get the advantage of the tool/argument parts, the
reply's tokens the advantage of the reply part (``TrainConfig.part_credit``).

A tool-using turn is scored in parts (e.g. the service desk's ``tool``, ``arguments`` and ``reply``, stored in
the reward's ``metadata["parts"]``), and GRPO gives every token of a sample the advantage of the whole reward
(Shao et al. 2024). In a group whose calls were all right but whose replies differ, the right calls of the
worse replies are then pushed down and those of the better ones up: noise on tokens that made no difference,
which cancels only in expectation. With part credit each role has its own reward (the mean of its parts), its
own group-relative advantage over that reward alone, and a token gets the advantage of its span's role:
turn-level credit assignment as in MT-GRPO (Zeng et al. 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents
via Turn-Level Credit Assignment", arXiv 2505.11821), with the reward's own verifiable parts as the turn-level
rewards.

Roles of a trajectory's completion tokens (:func:`span_role`, recorded by
:func:`~agentforge.trainers.samples.build_trajectories` in :attr:`Trajectory.roles`):

* :data:`CALL` — tokens of a span whose answer made tool calls: the ``call_parts`` (default ``tool`` +
  ``arguments``);
* :data:`REPLY` — tokens of a later span that made no call: the ``reply_parts`` (default ``reply``);
* :data:`WHOLE` — the first span when it made no call (deciding not to call *and* replying, in one answer), and
  tokens the policy did not sample: the whole reward's advantage, as in GRPO.

A sample whose reward has no value for a role's parts (no ``metadata["parts"]``, a masked slot) falls back to the
whole reward's advantage for that role's tokens, so a deployment without parts trains exactly as GRPO does.

How it plugs into TRL: the two role rewards are extra reward functions with weight 0 (TRL gathers them across
processes with the stored reward and logs ``rewards/part_call/mean`` and ``rewards/part_reply/mean``; the
whole reward and so TRL's scalar advantage are unchanged), and :class:`PartCredit` replaces TRL's advantages,
shape ``(B,)``, with per-token ones, shape ``(B, T)``, which TRL 1.16's ``_compute_loss`` accepts as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentforge.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from agentforge.types import Span

__all__ = [
    "CALL",
    "PARTS_COLUMN",
    "REPLY",
    "ROLE_COLUMN",
    "WHOLE",
    "PartCredit",
    "parse_parts",
    "part_advantages",
    "part_reward_funcs",
    "span_role",
]

#: Token role: the whole reward's advantage (GRPO's).
WHOLE = 0
#: Token role: a span that made tool calls (the call parts' advantage).
CALL = 1
#: Token role: a later span that made no call (the reply parts' advantage).
REPLY = 2
#: Sample column: the reward's parts, ``{name: float}`` (``{}`` when it has none).
PARTS_COLUMN = "parts"
#: Sample column: one role per completion token, shape ``(C,)``; popped before TRL sees the samples.
ROLE_COLUMN = "token_role"


def span_role(span: Span, first: bool) -> int:
    """The role of ``span``'s completion tokens: :data:`CALL` when it made tool calls, else :data:`WHOLE` for a
    trajectory's first span and :data:`REPLY` for a later one."""
    if span.llm is not None and span.llm.tool_calls:
        return CALL
    return WHOLE if first else REPLY


def parse_parts(text: str, what: str) -> tuple[str, ...]:
    """``"tool+arguments"`` → ``("tool", "arguments")``.

    Raises:
        ConfigError: no part name, or an empty one (``"tool++reply"``).
    """
    names = tuple(p.strip() for p in text.split("+"))
    if not text.strip() or not all(names):
        raise ConfigError(f"{what}={text!r}: reward part names joined by '+', e.g. 'tool+arguments'")
    return names


def _role_reward(parts: Any, names: Sequence[str]) -> float | None:
    if not isinstance(parts, Mapping):
        return None
    values: list[float] = []
    for name in names:
        value = parts.get(name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return None
        values.append(float(value))
    return sum(values) / len(values)


def part_reward_funcs(call_parts: Sequence[str], reply_parts: Sequence[str]) -> list[Callable[..., Any]]:
    """The two role rewards as TRL reward functions (``part_call``, ``part_reply``): the mean of the sample's
    ``parts`` named, ``None`` (unscorable) where one is missing or not a finite number."""

    def part_call(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [_role_reward(p, call_parts) for p in kwargs.get(PARTS_COLUMN) or [None] * len(prompts)]

    def part_reply(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [_role_reward(p, reply_parts) for p in kwargs.get(PARTS_COLUMN) or [None] * len(prompts)]

    return [part_call, part_reply]


def part_advantages(
    whole: torch.Tensor,
    role_rewards: torch.Tensor,
    roles: Sequence[Sequence[int]],
    *,
    group_size: int,
    first_row: int,
    width: int,
    scale_rewards: str = "group",
) -> torch.Tensor:
    """Per-token advantages from the role rewards (module docstring).

    Args:
        whole: this process's whole-reward advantages as TRL computed them, shape ``(B,)``.
        role_rewards: the call and reply rewards of every process's rows, shape ``(N, 2)`` (NaN = none), in
            TRL's order (groups of ``group_size`` consecutive rows).
        roles: this process's token roles, one list per row (length ``B``), each up to ``width`` long.
        group_size: ``G``.
        first_row: index in ``role_rewards`` of this process's first row.
        width: the padded completion length ``T``.
        scale_rewards: TRL's ``scale_rewards``: ``"group"`` (divide by the group's std), ``"batch"`` (by the
            batch's) or ``"none"``.

    Returns:
        Advantages, shape ``(B, T)``: each token its role's group-relative advantage, the whole one for
        :data:`WHOLE` tokens and wherever a row's role reward is missing.

    Raises:
        ConfigError: ``N`` is not a multiple of ``G`` or ``scale_rewards`` is unknown.
    """
    import torch
    from trl.trainer.utils import nanstd

    rows, device = whole.shape[0], whole.device
    if role_rewards.shape[0] % group_size:
        raise ConfigError(f"{role_rewards.shape[0]} rows are not whole groups of {group_size}")
    grouped = role_rewards.to(device=device, dtype=torch.float32).view(-1, group_size, role_rewards.shape[1])
    centred = grouped - torch.nanmean(grouped, dim=1, keepdim=True)
    if scale_rewards == "group":
        centred = centred / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
    elif scale_rewards == "batch":
        centred = centred / (nanstd(role_rewards.to(device), dim=0) + 1e-4).view(1, 1, -1)
    elif scale_rewards != "none":
        raise ConfigError(f"scale_rewards={scale_rewards!r} (must be 'group', 'batch' or 'none')")
    local = centred.reshape(-1, role_rewards.shape[1])[first_row : first_row + rows]
    call = torch.where(torch.isnan(local[:, 0]), whole, local[:, 0])
    reply = torch.where(torch.isnan(local[:, 1]), whole, local[:, 1])
    table = torch.full((rows, width), WHOLE, dtype=torch.long, device=device)
    for row, row_roles in enumerate(roles):
        values = list(row_roles)[:width]
        if values:
            table[row, : len(values)] = torch.tensor(values, dtype=torch.long, device=device)
    out = whole.unsqueeze(1).expand(rows, width).clone()
    out = torch.where(table == CALL, call.unsqueeze(1), out)
    return torch.where(table == REPLY, reply.unsqueeze(1), out)


def _scale_name(value: Any) -> str:
    """TRL's ``scale_rewards`` as a name (older releases took ``True``/``False`` for ``"group"``/``"none"``)."""
    if isinstance(value, bool):
        return "group" if value else "none"
    return str(value)


class PartCredit:
    """Mixin for ``trl.GRPOTrainer``: per-token advantages by reward part and span when ``args.part_credit``.

    Needs the lightning trainer's reward functions ``[stored_reward, part_call, part_reply]`` with weights
    ``[1, 0, 0]`` (:func:`part_reward_funcs`) and the rows' token roles through :meth:`set_token_roles`.
    Without either it leaves TRL's advantages as they are.
    """

    _token_roles: list[list[int]] | None = None
    _role_rewards: torch.Tensor | None = None

    def set_token_roles(self, roles: Sequence[Sequence[int]] | None) -> None:
        """The next generation batch's token roles, one list per row of this process (``None``: none)."""
        self._token_roles = None if roles is None else [list(r) for r in roles]

    def _calculate_rewards(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        rewards = super()._calculate_rewards(*args, **kwargs)  # type: ignore[misc]
        self._role_rewards = rewards[:, 1:3] if rewards.shape[1] >= 3 else None
        return rewards

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        self._role_rewards = None
        out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        roles, role_rewards, self._token_roles, self._role_rewards = (
            self._token_roles,
            self._role_rewards,
            None,
            None,
        )
        advantages = out.get("advantages")
        if not getattr(self.args, "part_credit", False) or advantages is None:  # type: ignore[attr-defined]
            return out
        if role_rewards is None or roles is None or len(roles) != advantages.shape[0]:
            return out
        out["advantages"] = part_advantages(
            advantages,
            role_rewards,
            roles,
            group_size=int(self.num_generations),  # type: ignore[attr-defined]
            first_row=int(self.accelerator.process_index) * advantages.shape[0],  # type: ignore[attr-defined]
            width=int(out["completion_ids"].shape[1]),
            scale_rewards=_scale_name(self.args.scale_rewards),  # type: ignore[attr-defined]
        )
        return out
