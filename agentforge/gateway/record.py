"""Recording one gateway call as a span: the span's fields, orphans, and the wait for its commit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse

from agentforge.errors import NotFoundError, UserError
from agentforge.gateway.call import CallContext, accepted_fields, clean_text
from agentforge.gateway.guided import GUIDED_LOGPROBS
from agentforge.gateway.prefix import Continuations
from agentforge.privacy.answer import UNSAMPLED_FROM
from agentforge.types import LLMCall, Span, SpanKind, now

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.privacy.answer import EngineTokens
    from agentforge.privacy.flight import PrivacyGuard

__all__ = ["SpanRecorder"]

logger = logging.getLogger("agentforge.gateway")

#: Seconds between two WARNINGs of one kind about how calls were attributed (:meth:`SpanRecorder._log`).
_WARN_EVERY_S = 60.0


def _mode(ctx: CallContext) -> dict[str, str]:
    """The engine's log-prob mode (``trainers.logprob_match`` reads it) and the client's dialect as span
    attributes, when known."""
    out = {"logprobs_mode": ctx.logprobs_mode} if ctx.logprobs_mode else {}
    if ctx.dialect is not None:
        out["dialect"] = ctx.dialect
    return out


class SpanRecorder:
    """Writes the span of each call to ``store`` (see :meth:`record`).

    Attributes:
        store: the trace store spans go to (through its group-commit writer).
        orphans: spans written without a rollout so far.
        prefix: the rollouts' recent calls, which follow-up calls continue token-exactly
            (:mod:`agentforge.gateway.prefix`).
    """

    privacy: PrivacyGuard | None = None  #: the gateway's privacy policy, which seals spans off the event loop

    def __init__(self, store: TraceStore) -> None:
        self.store = store
        self.prefix = Continuations(stored=self._chat_spans)
        self.orphans = 0
        self._warned: dict[str, tuple[float, int]] = {}  # kind -> (time of its last WARNING, quiet since)

    async def record(
        self,
        ctx: CallContext,
        llm: LLMCall,
        error: str | None = None,
        **attributes: Any,
    ) -> None:
        """Write the call's span and wait until it is committed; store failures are logged, not raised.
        The write itself always finishes (``asyncio.shield``), even when the waiting caller is cancelled.
        In ``mask`` mode personal data the model wrote is masked first, in what is stored and in what later
        continuations show the engine (:mod:`agentforge.privacy.answer`)."""
        if self.privacy is not None and (llm.response_text or llm.tool_calls):
            llm, ctx.privacy, wrote = await self.privacy.amask_answer(
                ctx.rollout_id, ctx.privacy, llm, self.engine_tokens(ctx)
            )
            attributes = {**attributes, **wrote}
            guided = attributes.get(GUIDED_LOGPROBS)
            if UNSAMPLED_FROM in wrote and isinstance(guided, list) and llm.completion_token_ids is not None:
                # one per stored token: the re-tokenised tail has env_mask 0, so 0.0 ("forced") changes nothing
                n = int(wrote[UNSAMPLED_FROM])
                attributes[GUIDED_LOGPROBS] = [*guided[:n], *[0.0] * (len(llm.completion_token_ids) - n)]
        self.prefix.remember(ctx, llm)  # later calls of the rollout may continue this one
        if ctx.privacy is not None:  # redaction counts; in redact mode redacted text, withheld ids
            guard = self.privacy
            llm, sealed = await guard.aseal(ctx.privacy, llm) if guard is not None else ctx.privacy.seal(llm)
            attributes = {**attributes, **sealed}
            if llm.logprobs is None:  # withheld: the masked ones of a guided call too
                attributes.pop(GUIDED_LOGPROBS, None)
        span = Span(
            rollout_id=ctx.rollout_id,
            attempt_id=ctx.attempt_id,
            kind=SpanKind.llm,
            name=f"{ctx.endpoint}.completions" if ctx.endpoint == "chat" else "completions",
            status="error" if error else "ok",
            error=clean_text(error) if error else None,
            llm=llm,
            attributes={"endpoint": ctx.endpoint, **_mode(ctx), **attributes},
            started_at=ctx.started_at,
            ended_at=now(),
            tenant=ctx.tenant,
        )
        if ctx.rollout_id is None and ctx.attempt_id is None:  # the store finds an attempt's rollout
            self._orphan(span)
            self._log(
                "unattributed",
                "gateway call stored as an orphan span (no rollout id in the URL or X-Rollout-Id header); point "
                "the client at <gateway>/rollouts/<rollout_id>/v1 or send the X-Rollout-Id header to attribute it",
            )
        await self._write(span)

    def _chat_spans(self, rollout_id: str) -> list[Span]:
        """The rollout's recorded LLM calls, oldest first (read in a worker thread by :class:`Continuations`
        to continue a conversation another replica, or this process before a restart, answered)."""
        return self.store.list_spans(rollout_id=rollout_id, kind=SpanKind.llm)

    def engine_tokens(self, ctx: CallContext) -> EngineTokens | None:
        """The tokenizer routes of the engine that served ``ctx`` (``None``: none known; the gateway's own
        override asks the engine)."""
        return None

    def _orphan(self, span: Span) -> None:
        span.attributes["orphan"] = True
        self.orphans += 1

    def _log(self, kind: str, message: str, *args: Any) -> None:
        """Log ``message`` as a WARNING at most once a minute per ``kind`` (``DEBUG`` in between), saying how
        many more of its kind came since the last WARNING: a misconfigured client calls thousands of times."""
        last, quiet = self._warned.get(kind, (-_WARN_EVERY_S, 0))
        clock = time.monotonic()
        if clock - last < _WARN_EVERY_S:
            self._warned[kind] = (last, quiet + 1)
            logger.debug(message, *args)
            return
        self._warned[kind] = (clock, 0)
        if quiet:
            message += f" ({quiet} more like it in the last minute)"
        logger.warning(message, *args)

    async def _write(self, span: Span) -> None:
        """Hand the span to the store's group-commit writer and wait until it is committed (the event loop
        is never blocked; concurrent calls share one transaction).

        A span the store rejects for its attribution is still kept: with an attempt id the store does not
        know (or of another rollout), in its rollout without that attempt, ``attributes["claimed_attempt_id"]``
        and ``llm.trainable = False`` (flag ``attempt_rejected``: which attempt produced it is unknown); with a
        rollout the store does not know, as an orphan with ``claimed_rollout_id`` (and ``claimed_attempt_id``).
        Each rejection is logged with the store's reason (rate-limited, see :meth:`_log`)."""
        try:
            try:  # a caller that leaves must not cancel the queued write (submit_async writes regardless)
                stored = await self._submit(span)
                if stored.attributes.get("late") is True:  # quarantined by the store (DESIGN fact 8)
                    logger.warning(
                        "late call stored as a late span %s (not training data): %s",
                        span.span_id,
                        stored.attributes.get("late_reason"),
                    )
                return
            except (NotFoundError, UserError) as exc:
                rejected = exc
            if span.attempt_id is not None:
                claimed_attempt = span.attempt_id
                span = span.model_copy(update={"attempt_id": None})
                span.attributes = {**span.attributes, "claimed_attempt_id": clean_text(claimed_attempt)}
                if span.llm is not None:
                    span.llm = span.llm.model_copy(
                        update={"trainable": False, "flags": [*span.llm.flags, "attempt_rejected"]}
                    )
                if span.rollout_id is not None:
                    try:
                        await self._submit(span)
                        self._log(
                            "attempt",
                            "gateway call kept in rollout %r without its attempt (not training data): the store "
                            "rejected attempt %r: %s",
                            span.rollout_id,
                            claimed_attempt,
                            rejected,
                        )
                        return
                    except (NotFoundError, UserError) as exc:
                        rejected = exc
            claimed = span.rollout_id
            span = span.model_copy(update={"rollout_id": None})
            if claimed is not None:
                span.attributes = {**span.attributes, "claimed_rollout_id": clean_text(claimed)}
            self._orphan(span)
            await self._submit(span)
            self._log(
                "rejected",
                "gateway call stored as an orphan span: the store rejected its attribution (rollout %r, attempt %r): "
                "%s; a rollout must be in the store before its calls (POST /api/rollouts, TraceStore.enqueue_rollout)",
                claimed,
                span.attributes.get("claimed_attempt_id"),
                rejected,
            )
        except Exception:
            logger.exception("could not store the span of a gateway call (span %s)", span.span_id)

    def _submit(self, span: Span) -> Awaitable[Any]:
        submit_async = getattr(self.store, "submit_async", None)
        if submit_async is not None:
            return submit_async(span)
        return asyncio.shield(asyncio.wrap_future(self.store.submit(span)))

    def failed_call(self, ctx: CallContext, **fields: Any) -> LLMCall:
        """The LLMCall of a call that produced no answer. Under a privacy policy its stored request keeps
        only the fields the route takes (the ones the policy's walk masks): a refused field's text is not
        stored."""
        request = ctx.body if self.privacy is None else accepted_fields(ctx.body, ctx.endpoint)
        return LLMCall(
            model=ctx.model,
            version=ctx.version,
            endpoint=ctx.endpoint,
            stream=bool(ctx.body.get("stream")),
            request=request,
            latency_s=ctx.latency_s(),
            trainable=False,
            **fields,
        )

    async def fail(self, ctx: CallContext, status: int, body: dict[str, Any], flag: str) -> JSONResponse:
        """Record a failed span and return the OpenAI-style error to the client."""
        await self.record(
            ctx, self.failed_call(ctx, flags=[flag]), error=body["error"]["message"], http_status=status
        )
        return JSONResponse(body, status_code=status)
