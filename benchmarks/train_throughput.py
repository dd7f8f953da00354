"""Training throughput and model-FLOPs utilisation of a LoRA update, against a matmul peak measured here.

No network, no model hub: the model is a randomly initialised Qwen2-0.5B-shaped causal LM (transformers
``Qwen2Config``), the batches are random token ids. Needs only torch, transformers, peft (and accelerate).

* **peak**: the best of a few large bf16 (GPU) or float32/bf16 (CPU) matmuls, in FLOP/s, measured in this run;
* **train**: forward + backward + AdamW step of a LoRA adapter (r=16, all linear layers) on (B, T) tokens;
* **MFU** = achieved model FLOP/s ÷ peak. Model FLOPs per token of a LoRA step ≈ 4·N (forward 2·N plus the
  activation-gradient half of the backward; frozen weights get no weight gradients) + the attention term
  4·L·T·d (Chinchilla appendix F / PaLM appendix B accounting, with 6N → 4N for frozen weights).

    python benchmarks/train_throughput.py              # GPU: 0.5B shape, bf16; fits in a few minutes on an H200
    python benchmarks/train_throughput.py --tiny       # CPU-sized smoke run (CI)
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def matmul_peak(device: str, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """Best observed FLOP/s of an ``n × n`` by ``n × n`` matmul (2·n³ FLOPs)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def build_model(tiny: bool, device: str, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    if tiny:
        config = Qwen2Config(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
        )
    else:  # the Qwen2-0.5B shape
        config = Qwen2Config(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
        )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora), config


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU-sized model and batch")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    batch = args.batch or (4 if args.tiny else 16)
    seq = args.seq or (64 if args.tiny else 1024)
    steps = args.steps or (3 if args.tiny else 20)

    peak = matmul_peak(device, dtype, 512 if args.tiny else 8192)
    model, config = build_model(args.tiny, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (batch, seq), device=device)

    def step() -> float:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        return float(out.loss)

    step()  # warm-up (allocations, kernels)
    sync(device)
    t0 = time.perf_counter()
    losses = [step() for _ in range(steps)]
    sync(device)
    elapsed = time.perf_counter() - t0
    tokens = batch * seq * steps
    flops_per_token = 4 * params + 4 * config.num_hidden_layers * seq * config.hidden_size
    achieved = tokens * flops_per_token / elapsed
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "params": params,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "tokens_per_s": tokens / elapsed,
        "matmul_peak_tflops": peak / 1e12,
        "model_tflops": achieved / 1e12,
        "mfu": achieved / peak,
        "loss_first_last": [losses[0], losses[-1]],
    }
    print(json.dumps(result, indent=1))
    print(
        f"training {result['tokens_per_s']:.0f} tokens/s; MFU {result['mfu']:.1%} of a measured "
        f"{result['matmul_peak_tflops']:.2f} TFLOP/s matmul peak ({result['dtype']}, {result['device']})"
    )


if __name__ == "__main__":
    main()
