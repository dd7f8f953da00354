# agentforge developer commands. `make demo` and `make test` each set up everything first (idempotent).
.PHONY: setup demo test test-fast lint bench postgres

PYTEST_ARGS ?=
# two pytest-xdist workers: the vllm tests in one group on one worker (tests/conftest.py), the rest on the other
XDIST ?= -n 2 --dist loadgroup
# test-fast: four workers on 2 cores; its tests mostly wait on sockets and child processes, so four overlap
# their waits (1,006 tests: 198 s with two workers, 173 s with four; docs/performance.md)
FAST_XDIST ?= -n 4

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/python examples/main_job.py

postgres:
	bash scripts/start_postgres.sh

test: setup
	AGENTFORGE_TEST_PG_URL="$$(bash scripts/start_postgres.sh | tail -n 1)" AGENTFORGE_REQUIRE_VLLM=1 AGENTFORGE_REQUIRE_FRAMEWORKS=1 AGENTFORGE_REQUIRE_DATA=1 AGENTFORGE_REQUIRE_BROWSER=1 AGENTFORGE_REQUIRE_PHOENIX=1 AGENTFORGE_REQUIRE_HAPROXY=1 \
		.venv/bin/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: setup
	.venv/bin/python -m pytest $(FAST_XDIST) -m "not vllm and not slow and not postgres" $(PYTEST_ARGS)

lint:
	.venv/bin/ruff check agentforge agents stores trainers tests examples benchmarks plugins
	.venv/bin/ruff format --check agentforge agents stores trainers tests examples benchmarks plugins
	.venv/bin/python scripts/lint_imports.py
	.venv/bin/python scripts/typecheck.py

bench: setup
	.venv/bin/python benchmarks/grpo_step_time.py
	.venv/bin/python benchmarks/runner_overhead.py
	.venv/bin/python benchmarks/train_throughput.py $$(command -v nvidia-smi >/dev/null || echo --tiny)
	.venv/bin/python benchmarks/hotswap.py
	.venv/bin/python benchmarks/gateway.py
	.venv/bin/python benchmarks/dashboard.py
	.venv/bin/python benchmarks/store.py --pg-url "$$(bash scripts/start_postgres.sh | tail -n 1)"
