"""Hypothesis settings and strategies shared by the fuzz tests of the gateway and the store API."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Fixed examples (``derandomize``), no per-example deadline (the machines are noisy), module fixtures.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)


def json_values(max_leaves: int = 20, max_text: int = 40) -> st.SearchStrategy[object]:
    """Any JSON value: null, booleans, integers beyond 64 bits, finite floats, text, and lists/objects of
    those nested up to ``max_leaves`` leaves."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=max_text),
    )
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=max_leaves,
    )
