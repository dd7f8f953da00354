"""Quickstart: an ordinary agent serves through the gateway, two GRPO steps train on what it did, and each new
adapter is hot-swapped in while it keeps serving. No vLLM needed (the embedded engine; ``--backend vllm`` for
speed). Prints the served version before and after, and the reward of each step.

    python examples/quickstart.py [--backend vllm]
"""

import sys

import agentforge as af


def agent(task, ctx):  # noqa: ANN001, ANN201 - any callable agent(task, ctx) -> reward
    """An agent that only talks to the gateway (``ctx.openai_client()``); its reward: a word with the letter."""
    ask = [{"role": "user", "content": f"Say a word that starts with {task.input['letter']}."}]
    client = ctx.openai_client()
    out = client.chat.completions.create(model="policy", messages=ask, max_tokens=4, temperature=1.0)
    return float((out.choices[0].message.content or "").strip().lower().startswith(task.input["letter"]))


def main(backend: str = "embedded", steps: int = 2, out: str = "runs/quickstart") -> dict:
    store = af.open_store(f"sqlite:///{out}.db")
    tasks = [af.Task(task_id=f"letter-{c}", input={"letter": c}) for c in "abcs"]
    shape = dict(num_generations=4, tasks_per_step=2, max_completion_length=4)  # groups of 4, 2 tasks a step
    config = af.TrainConfig(output_dir=out, max_steps=steps, learning_rate=5e-4, **shape)
    with af.LocalStack(store, agent, backend=backend, workers=4) as stack:
        print("serving", stack.router.alias("policy"))
        publisher = af.HotSwapPublisher(stack.swapper, store)
        result = af.LightningTrainer(af.prepare_default_model(), store, tasks, config, publisher).train()
        print("serving", stack.router.alias("policy"), "after", result["steps"], "steps:", result["versions"])
    return result


if __name__ == "__main__":
    main("vllm" if sys.argv[1:] == ["--backend", "vllm"] else "embedded")
