"""The dashboard in a real browser (Debian's chromium, headless, driven by Playwright) over a store that a real
training run filled: runner → gateway → embedded engine (a tiny random Llama with SmolLM2's tokenizer), two GRPO
steps through ``LightningTrainer`` with hot-swapped versions. The dashboard is mounted on that run's gateway
at ``/dashboard`` the way ``agentforge serve`` mounts it.

Checks what a person would look at: the runs page draws a reward curve (Chart.js points for each logged step),
the rollout page shows every span and a token view with exactly the trainer's number of trainable tokens, the
versions page marks the live version. A full-page screenshot of each page is written under the test's tmp
directory and copied to ``$AGENTFORGE_SCREENSHOT_DIR`` when that is set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from prerequisites import missing
from tiny_model import tiny_model
from trainer_process import letter_agent

from agentforge.dashboard.app import CHART_JS, MOUNT_PATH, create_dashboard_app
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.stores.sql import SQLStore
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.trainers.samples import build_trajectories
from agentforge.types import ResourceVersion, RolloutState, Span, SpanKind, Task

pytestmark = pytest.mark.slow

REQUIRE_BROWSER = "AGENTFORGE_REQUIRE_BROWSER"
STEPS = 2


def _browser() -> str:
    """The system chromium; a missing browser, Playwright or Chart.js skips (fails under the switch)."""
    path = shutil.which("chromium")
    if path is None:
        missing("Debian's chromium is not installed (scripts/setup.sh installs it)", REQUIRE_BROWSER)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing('playwright is not installed (pip install -e ".[dev]")', REQUIRE_BROWSER)
    if not CHART_JS.is_file():
        missing(f"Chart.js is not installed at {CHART_JS} (scripts/setup.sh runs npm ci)", REQUIRE_BROWSER)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A store filled by a real two-step GRPO run, served with the dashboard mounted on the run's gateway."""
    chromium = _browser()
    tmp = tmp_path_factory.mktemp("dashboard")
    model = tiny_model()
    store = SQLStore(f"sqlite:///{tmp / 'traces.db'}")
    server = EmbeddedServer(model, max_lora_rank=16)
    server.start()
    router = ModelRouter()
    swapper = HotSwapper(server, router, alias="policy")
    swapper.register_base()
    dashboard = create_dashboard_app(store, tokenizer=model, poll_s=1.0)
    gateway = GatewayServer(store, router, mounts={MOUNT_PATH: dashboard}).start()
    runner = Runner(store, letter_agent, gateway.url, workers=2, mode="thread").start()
    try:
        tasks = [Task(task_id=f"letter-{c}", input={"letter": c, "parity": True}) for c in "abst"]
        config = TrainConfig(
            output_dir=str(tmp / "run"),
            num_generations=4,
            tasks_per_step=2,
            max_steps=STEPS,
            swap_every=1,
            learning_rate=5e-4,
            lora_r=8,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            seed=0,
            max_completion_length=8,
            rollout_timeout_s=120,
            wait_timeout_s=300,
        )
        trainer = LightningTrainer(model, store, tasks, config, HotSwapPublisher(swapper, store))
        result = trainer.train()
        for text in ("Answer in one word.", "Answer in one word that starts with the letter."):
            store.publish_resource(
                ResourceVersion(name="prompt:letter", kind="prompt", payload={"template": text})
            )
        yield {
            "store": store,
            "url": f"{gateway.url}{MOUNT_PATH}",
            "run_id": trainer.run_id,
            "result": result,
            "chromium": chromium,
            "tmp": tmp,
        }
    finally:
        runner.stop()
        gateway.stop()
        server.stop()
        store.close()


@pytest.fixture(scope="module")
def browser(run):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=run["chromium"], headless=True, args=["--no-sandbox"])
        yield launched
        launched.close()


def _screenshot(page, run, name: str) -> None:
    path = run["tmp"] / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("AGENTFORGE_SCREENSHOT_DIR"):
        target = Path(os.environ["AGENTFORGE_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)


def _painted(page, selector: str) -> int:
    """Non-transparent pixels on a canvas: Chart.js drew something there."""
    return page.evaluate(
        """sel => { const c = document.querySelector(sel); const d = c.getContext("2d")
                 .getImageData(0, 0, c.width, c.height).data; let n = 0;
                 for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }""",
        selector,
    )


def test_runs_page_draws_the_reward_curve(run, browser) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{run['url']}/runs")
    page.wait_for_function("() => window.agentforgeCharts && Object.keys(window.agentforgeCharts).length > 0")
    steps = len(run["result"]["history"])
    assert steps == STEPS
    points = page.evaluate(
        "id => window.agentforgeCharts[id].reward.getDatasetMeta(0).data.filter(p => !p.skip).length",
        run["run_id"],
    )
    assert points == steps  # one drawn point per logged step's batch reward
    assert _painted(page, ".reward-chart") > 1000 and _painted(page, ".steptime-chart") > 1000
    assert page.locator("#timeline tr.published").count() == len(run["result"]["versions"])
    _screenshot(page, run, "runs")
    # live: a step logged while the page is open shows up on the open chart at the next poll (1 s here)
    attrs = {
        "run_id": run["run_id"],
        "step": steps + 1,
        "reward": 0.5,
        "train/step_s": 1.0,
        "version": "policy@v2",
    }
    run["store"].add_span(Span(kind=SpanKind.custom, name="trainer.metrics", attributes=attrs))
    page.wait_for_function(
        "([id, n]) => window.agentforgeCharts[id].reward.getDatasetMeta(0).data.length === n",
        arg=[run["run_id"], steps + 1],
        timeout=15_000,
    )
    assert errors == []
    page.close()


def test_rollout_page_shows_spans_and_the_trainable_tokens(run, browser) -> None:
    store = run["store"]
    rollouts = [
        r
        for r in store.list_rollouts(state=RolloutState.succeeded)
        if r.metadata.get("trainer_run") == run["run_id"]
    ]
    rollout = rollouts[0]
    spans = store.list_spans(rollout_id=rollout.rollout_id)
    llm = [s for s in spans if s.kind == SpanKind.llm]
    trajectories = build_trajectories(store.list_spans(rollout_id=rollout.rollout_id, valid_only=True))
    trainable = trajectories[-1].sampled_tokens
    assert trainable == sum(len(s.llm.completion_token_ids) for s in llm) > 0  # one call: all it sampled

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{run['url']}/rollouts")
    page.locator(f"a[href$='/rollouts/{rollout.rollout_id}']").click()
    page.wait_for_function("() => window.agentforgeTimeline !== undefined")
    assert page.locator("#spans tr.span-row").count() == len(spans)
    assert page.evaluate("() => window.agentforgeTimeline.getDatasetMeta(0).data.length") == len(spans)
    assert page.locator("#spans tr.span-row.llm").first.inner_text().count(llm[0].llm.version) == 1
    trains = page.locator(".trajectory.trains")
    assert trains.locator(".tok.trained").count() == trainable
    assert int(trains.locator(".trainable-count").get_attribute("data-count")) == trainable
    assert page.locator("#conversation .msg.user").first.inner_text().startswith("user")
    _screenshot(page, run, "rollout")
    page.close()


def test_versions_page_marks_the_live_version(run, browser) -> None:
    live = run["store"].get_resource("policy").ref
    assert live == run["result"]["versions"][-1]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{run['url']}/versions")
    marked = page.locator("section[data-name='policy'] tr.version.live")
    assert marked.count() == 1 and marked.get_attribute("data-ref") == live
    assert marked.locator(".badge").inner_text() == "live"
    assert page.locator("section[data-name='policy'] .live-ref").inner_text() == live
    page.locator("section[data-name='prompt:letter'] button").click()
    assert "+Answer in one word that starts with the letter." in page.locator("#diff").inner_text()
    _screenshot(page, run, "versions")
    page.close()
