"""TRL's private pieces are used only on the TRL release the tests ran on, and pyproject pins that release."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from agentforge.errors import UserError
from agentforge.trainers.trl_private import TESTED_TRL_MINOR, TRL_RANGE, check_trl_version

ROOT = Path(__file__).resolve().parents[3]


def test_pyproject_pins_trl_to_the_tested_range_and_it_is_installed() -> None:
    train = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    (trl,) = [Requirement(r) for r in train if Requirement(r).name == "trl"]
    assert trl.specifier == SpecifierSet(TRL_RANGE) and TRL_RANGE == f">={TESTED_TRL_MINOR[0]}.16,<1.17"
    assert trl.specifier.contains(version("trl"))
    check_trl_version("anything")  # the installed TRL passes


@pytest.mark.parametrize("other", ["1.17.0", "1.15.2", "2.16.0", "not-a-version"])
def test_another_trl_is_refused_with_the_pip_line_that_fixes_it(other: str) -> None:
    with pytest.raises(
        UserError, match=rf'private GRPOTrainer._metrics.*trl {other} .*pip install "trl>=1.16,<1.17"'
    ):
        check_trl_version("GRPOTrainer._metrics", installed=other)
    check_trl_version("GRPOTrainer._metrics", installed="1.16.9")  # patch releases are accepted
