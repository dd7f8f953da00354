"""Helpers for tests that start an engine: a marked chat template, and the prompt an engine rendered."""

from __future__ import annotations

from pathlib import Path


def marked_template(folder: Path) -> Path:
    """agentforge's tool-call chat template with a marker before everything it renders."""
    from agentforge.serving.vllm_files import tool_chat_template

    path = folder / "marked.jinja"
    path.write_text("{{- 'LIBRARY-DESK-MARK ' -}}\n" + tool_chat_template().read_text(), encoding="utf-8")
    return path


def rendered_prompt(base_url: str, key: str, model: str, base_model: str) -> str:
    """The prompt text the engine rendered for one chat request with a tool (decoded from its prompt ids)."""
    import httpx
    from transformers import AutoTokenizer

    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Lend me Dune."}],
        "max_tokens": 1,
        "return_token_ids": True,
        "tools": [{"type": "function", "function": {"name": "find_book", "parameters": {"type": "object"}}}],
    }
    answer = httpx.post(
        f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    return str(AutoTokenizer.from_pretrained(base_model).decode(answer.json()["prompt_token_ids"]))
