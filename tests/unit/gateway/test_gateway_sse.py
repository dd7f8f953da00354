"""The gateway's SSE reader (agentforge.gateway.stream.sse_batches) yields every ``data`` payload exactly once
and in order, however the engine's bytes are cut into reads (its one-line fast path and the general parser
agree)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fuzzing import FUZZ
from hypothesis import given
from hypothesis import strategies as st

from agentforge.gateway.stream import sse_batches
from agentforge.gateway.upstream import UpstreamResponse

_payload = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=30
)


def _read(blocks: list[bytes]) -> list[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for block in blocks:
            yield block

    async def main() -> list[bytes]:
        out: list[bytes] = []
        async for batch in sse_batches(UpstreamResponse(200, None, gen())):
            out.extend(batch)
        return out

    return asyncio.run(main())


@FUZZ
@given(
    st.lists(
        st.tuples(_payload, st.sampled_from(["data: ", "data:"]), st.booleans()), min_size=1, max_size=8
    ),
    st.lists(st.integers(min_value=1, max_value=40), max_size=6),
)
def test_payloads_survive_any_cut(events: list[tuple[str, str, bool]], cuts: list[int]) -> None:
    wire = b""
    expected = []
    for text, prefix, crlf in events:
        end = b"\r\n\r\n" if crlf else b"\n\n"
        wire += prefix.encode() + text.encode() + end
        expected.append(text.encode().removeprefix(b" ") if prefix == "data:" else text.encode())
    blocks, at = [], 0
    for cut in cuts:
        if at + cut < len(wire):
            blocks.append(wire[at : at + cut])
            at += cut
    blocks.append(wire[at:])
    assert _read(blocks) == expected
    assert _read([wire]) == expected


def test_multiline_data_and_comments_take_the_general_path() -> None:
    wire = b": keep-alive\n\ndata: a\ndata: b\n\nevent: x\ndata: c\n\n"
    assert _read([wire]) == [b"a\nb", b"c"]
