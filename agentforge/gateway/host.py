"""What a call's helpers may ask of the gateway that runs the call: a small protocol, not the gateway itself.

The stream relay (:mod:`agentforge.gateway.stream`) and the token-in continuation
(:mod:`agentforge.gateway.prefix`, :mod:`agentforge.gateway.prefix_call`) are handed the gateway serving the
call. They type it as :class:`CallHost`, so none of them imports :mod:`agentforge.gateway.app` (which imports
them): the gateway package has no import circle. ``app._Gateway`` is the one implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from starlette.responses import JSONResponse

    from agentforge.gateway.call import CallContext
    from agentforge.gateway.router import Upstream
    from agentforge.gateway.upstream import UpstreamClient, UpstreamResponse
    from agentforge.gateway.wire import Endpoint
    from agentforge.types import LLMCall

__all__ = ["CallHost"]


class CallHost(Protocol):
    """The gateway as a call's helpers see it (implemented by ``agentforge.gateway.app._Gateway``)."""

    @property
    def client(self) -> UpstreamClient:
        """The pooled upstream client."""
        ...

    async def send(
        self,
        ctx: CallContext,
        upstream: Upstream,
        endpoint: Endpoint,
        content: bytes,
        stream: bool,
        flags: tuple[str, ...] = (),
    ) -> UpstreamResponse | JSONResponse:
        """POST ``content`` to the engine; a transport failure comes back as a recorded error response."""
        ...

    async def record(
        self, ctx: CallContext, llm: LLMCall, error: str | None = None, **attributes: Any
    ) -> None:
        """Write the call's span and wait until it is committed."""
        ...

    def cache_salt(self, ctx: CallContext) -> str | None:
        """The engine prefix-cache salt of the call's tenant (``None``: no tenant, the shared cache)."""
        ...

    def failed_call(self, ctx: CallContext, **fields: Any) -> LLMCall:
        """The LLMCall of a call that produced no answer."""
        ...

    async def fail(self, ctx: CallContext, status: int, body: dict[str, Any], flag: str) -> JSONResponse:
        """Record a failed span and return the OpenAI-style error to the client."""
        ...
