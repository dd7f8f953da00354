"""The vLLM CPU LoRA plugin (``plugins/vllm_cpu_lora``): same results as vLLM's own ops, and active in serving.

The kernel check runs inside the vLLM interpreter (``.venv-vllm``) against vLLM's original
``vllm.lora.ops.torch_ops`` functions: random stacked adapters (3-D and 4-D), token slot indices that mix
several slots and ``-1`` (vLLM's "last slot" indexing), float32 and bfloat16, every ``add_inputs`` variant
and the ``sgmv`` (prefill) wrappers after :func:`register` patched the module.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from agentforge.config import vllm_python

pytestmark = pytest.mark.vllm

CHECK = r"""
import json, torch
import vllm.lora.ops.torch_ops.lora_ops as ops
import vllm.lora.punica_wrapper.punica_cpu as punica_cpu
import agentforge_vllm_cpu_lora as plugin

orig = {n: getattr(ops, n) for n in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand")}
torch.manual_seed(0)
results = []
def close(a, b, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return bool(torch.allclose(a.float(), b.float(), atol=tol, rtol=tol))

for dtype in (torch.float32, torch.bfloat16):
    for indices in ([0, 0, 0, 0, 0, 0], [2, 0, 2, 1, -1, 0], [-1] * 6, [3, 3, 1, 1, 1, 0]):
        idx = torch.tensor(indices)
        T, slots, r, hidden, out = len(indices), 4, 8, 32, 48
        x = torch.randn(T, hidden, dtype=dtype)
        a = torch.randn(slots, 1, r, hidden, dtype=dtype)       # shrink weights (4-D, as vLLM stacks them)
        b = torch.randn(slots, out, r, dtype=dtype)              # expand weights (3-D)
        h = torch.randn(T, r, dtype=torch.float32)
        for name, call in {
            "shrink": lambda f, y: f(x, a, y, idx, 0.5),
            "expand_add": lambda f, y: f(h, b, y, idx, True),
            "expand_set": lambda f, y: f(h, b, y, idx, False),
            "slice_add": lambda f, y: f(h, b, y, idx, 8, out, True),
            "slice_set": lambda f, y: f(h, b, y, idx, 8, out, False),
        }.items():
            kind = {"shrink": "bgmv_shrink", "expand_add": "bgmv_expand", "expand_set": "bgmv_expand"}.get(name, "bgmv_expand_slice")
            width = r if name == "shrink" else (out + 16 if name.startswith("slice") else out)
            base = torch.randn(T, width, dtype=dtype)
            y_ref, y_got = base.clone(), base.clone()
            call(orig[kind], y_ref)
            call(getattr(plugin, kind), y_got)
            results.append({"dtype": str(dtype), "indices": indices, "op": name, "ok": close(y_ref, y_got, dtype)})

plugin.register()
patched = ops.bgmv_shrink is plugin.bgmv_shrink and punica_cpu.bgmv_expand is plugin.bgmv_expand
# prefill wrappers: two sequences (3 + 2 tokens) on slots 1 and -1, through the patched module globals
x = torch.randn(5, 32); a = torch.randn(4, 1, 8, 32); y_ref = torch.zeros(5, 8); y_got = torch.zeros(5, 8)
seq = (torch.tensor([0, 3]), torch.tensor([3, 2]), torch.tensor([1, -1]), 2, 3, 5)
exploded = torch.tensor([1, 1, 1, -1, -1])
orig["bgmv_shrink"](x, a, y_ref, exploded, 0.5)  # vLLM's own per-token op on the exploded indices
ops.sgmv_shrink(x, a, y_got, *seq, 0.5)
results.append({"op": "sgmv_shrink", "ok": bool(torch.allclose(y_ref, y_got, atol=1e-5))})
print(json.dumps({"patched": patched, "results": results}))
"""


def _vllm_python():
    python = vllm_python()
    if python is None:
        pytest.skip("no vLLM virtual environment; run `make setup`")
    return python


def test_grouped_ops_equal_vllms_own_ops() -> None:
    proc = subprocess.run(
        [str(_vllm_python()), "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"AGENTFORGE_VLLM_CPU_LORA": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["patched"], "register() did not replace the ops vLLM's CPU punica wrapper calls"
    failed = [r for r in report["results"] if not r["ok"]]
    assert not failed, failed
    assert len(report["results"]) == 2 * 4 * 5 + 1


def test_plugin_is_installed_as_a_vllm_general_plugin() -> None:
    code = (
        "from importlib.metadata import entry_points;"
        "print(sorted(e.value for e in entry_points(group='vllm.general_plugins')))"
    )
    out = subprocess.run(
        [str(_vllm_python()), "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "agentforge_vllm_cpu_lora:register" in out.stdout


def test_served_vllm_runs_the_grouped_ops(vllm_server) -> None:
    """The session's vLLM server loaded the plugin in its engine process (its log says so)."""
    if vllm_server.log_path is None or not vllm_server.log_path.exists():
        pytest.skip("connected to an external vLLM server (AGENTFORGE_TEST_VLLM_URL): no log to read")
    assert "grouped CPU LoRA ops active" in vllm_server.log_path.read_text(errors="replace")
