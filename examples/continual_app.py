"""The customer-service app and a continual trainer side by side: users' thumbs up/down improve the policy.

One process runs the whole loop (for the pieces on separate machines, see docs/store_server.md):

* the policy engine (vLLM, or the embedded backend with ``--backend embedded``), the gateway and the store
  (``agentforge.stack.LocalStack``);
* the app of ``examples/app/service.py``, unchanged, on ``--port`` (uvicorn in a thread);
* :class:`agentforge.trainers.continual.ContinualTrainer`: every ``--tasks-per-step`` rated conversations
  it re-runs each conversation's opening ``--group-size`` times through the gateway, scores the replies
  against the rated one, takes a GRPO step on the LoRA adapter and hot-swaps the new version. The app keeps
  serving throughout; its next reply comes from the new version.

Try it::

    python examples/continual_app.py --backend embedded --port 8080
    curl -s -XPOST localhost:8080/sessions           # -> {"session_id": "ro_...", "session_token": "T", ...}
    curl -s -XPOST localhost:8080/sessions/ro_.../messages -d '{"content": "Where is my order W1001?"}' \\
         -H 'content-type: application/json' -H 'Authorization: Bearer T'
    curl -s -XPOST localhost:8080/sessions/ro_.../feedback -d '{"score": 1}' \\
         -H 'content-type: application/json' -H 'Authorization: Bearer T'

Ctrl-C stops the trainer (it publishes what it trained), then the app and the stack. For the order bot behind the
same app, with simulated customers whose ratings arrive late and promotions through the gate, see
``examples/continual_order_app.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _service():
    """``examples/app/service.py`` as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("continual_app_service", HERE / "app" / "service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (``--help`` lists them)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--store", default="sqlite:///continual-traces.db", help="SQLAlchemy URL (SQLite or PostgreSQL)"
    )
    parser.add_argument("--backend", choices=["vllm", "embedded"], default="vllm", help="policy engine")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="the app's port")
    parser.add_argument("--output-dir", default="continual-run", help="adapters, checkpoints, metrics.jsonl")
    parser.add_argument("--group-size", type=int, default=4, help="re-runs per rated opening (GRPO G)")
    parser.add_argument("--tasks-per-step", type=int, default=1, help="rated conversations per step")
    parser.add_argument("--swap-every", type=int, default=1, help="hot-swap every k steps")
    parser.add_argument(
        "--max-steps", type=int, default=None, help="stop after this many steps (default: never)"
    )
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--poll-s", type=float, default=2.0, help="seconds between store polls")
    parser.add_argument("--workers", type=int, default=4, help="replay runner threads")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (float32)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Start the stack, the app (thread) and the trainer (main thread, so Ctrl-C stops it cleanly)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    import uvicorn

    from agentforge import ContinualTrainer, HotSwapPublisher, LocalStack, TrainConfig, open_store

    store = open_store(args.store)
    config = TrainConfig(
        output_dir=args.output_dir,
        num_generations=args.group_size,
        tasks_per_step=args.tasks_per_step,
        swap_every=args.swap_every,
        learning_rate=args.learning_rate,
        lora_r=args.lora_r,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=args.cpu,
        bf16=not args.cpu,
    )
    with LocalStack(store, backend=args.backend, max_lora_rank=max(16, args.lora_r)) as stack:
        app = _service().create_app(stack.gateway.url, store)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
        threading.Thread(target=server.run, name="app", daemon=True).start()
        print(f"app on http://{args.host}:{args.port}  (gateway {stack.gateway.url})", flush=True)
        trainer = ContinualTrainer(
            stack.server.base_model,
            store,
            stack.gateway.url,
            config,
            HotSwapPublisher(stack.swapper, store),
            workers=args.workers,
            poll_s=args.poll_s,
        )
        try:
            result = trainer.run(max_steps=args.max_steps)
            print(f"trained {result['steps']} steps; versions {result['versions']}", flush=True)
        finally:
            server.should_exit = True
    store.close()


if __name__ == "__main__":
    main()
