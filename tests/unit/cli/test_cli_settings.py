"""Settings a new domain needs, reachable and described on the command line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from engine_helpers import marked_template, rendered_prompt
from typer.testing import CliRunner

from agentforge.cli import app

#: A wide, plain terminal: rich wraps help and error boxes at COLUMNS, which can split a long path or option.
WIDE = {"COLUMNS": "300", "NO_COLOR": "1"}


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    return re.sub(r"[\s│]+", " ", result.output)


def test_max_completion_length_says_what_it_counts() -> None:
    text = _help("train")
    assert "--max-completion-length" in text
    assert "sampled tokens plus the tool outputs and user turns" in text and "truncates nothing" in text


def test_serve_has_the_context_length() -> None:
    text = _help("serve")
    assert "--max-model-len" in text and "tool schemas" in text


def test_train_has_the_context_length() -> None:
    text = _help("train")
    assert "--max-model-len" in text and "tool schemas" in text


def test_train_and_serve_take_a_chat_template_that_must_exist(tmp_path: Path) -> None:
    assert "--chat-template" in _help("train") and "--chat-template" in _help("serve")
    # wide: a long tmp_path (e.g. a pytest-xdist worker's) must not wrap the file name in the error box
    missing = CliRunner().invoke(app, ["serve", "--chat-template", str(tmp_path / "nope.jinja")], env=WIDE)
    assert missing.exit_code == 2 and "nope.jinja" in missing.output, missing.output


@pytest.mark.slow
def test_the_local_stack_gives_the_engine_its_context_length_and_chat_template(tmp_path: Path) -> None:
    import openai

    from agentforge.stack import LocalStack
    from agentforge.testing import memory_store

    store = memory_store()
    template = marked_template(tmp_path)
    with LocalStack(store, backend="embedded", max_model_len=256, chat_template=template) as stack:
        assert stack.server.max_model_len == 256
        server = stack.server
        text = rendered_prompt(server.base_url, server.api_key, server.base_model_name, server.base_model)
        assert text.startswith("LIBRARY-DESK-MARK") and "find_book" in text
        client = openai.OpenAI(base_url=stack.server.base_url, api_key=stack.server.api_key, max_retries=0)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(
                model=stack.server.base_model_name, messages=[{"role": "user", "content": "word " * 400}]
            )
    store.close()


def test_the_guide_says_what_max_completion_length_counts() -> None:
    guide = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[3] / "docs" / "new_domain.md").read_text())
    assert "`--max-completion-length` is TRL's completion length" in guide
    assert (
        "tool outputs and customer turns" in guide and "caps no sampling" in guide and "`max_tokens`" in guide
    )
