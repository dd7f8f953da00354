"""The gateway's privacy hook: mask a request before the engine sees it, restore what the client receives,
and seal what is stored (counts; in ``redact`` mode redacted text and withheld ids).

The gateway calls :meth:`PrivacyGuard.begin` once per call; it returns ``None`` (nothing to do: privacy is
off, or the call carries no personal data and its rollout was never masked) or a :class:`CallPrivacy`
whose :meth:`~CallPrivacy.restore_body` / :meth:`~CallPrivacy.restore_sse` rewrite the answer and whose
:meth:`~CallPrivacy.seal` prepares the stored call. Mappings live only in this process's memory.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

import anyio

from agentforge.errors import MissingExtraError, UserError
from agentforge.privacy.answer import EngineTokens, answer_ids, answer_texts, mask_answer_text
from agentforge.privacy.config import PLACEHOLDER_RE, PrivacyConfig, PrivacyMode
from agentforge.privacy.detect import Detector, digit_count
from agentforge.privacy.mapping import Mapping, split_open_tail
from agentforge.types import LLMCall

__all__ = ["PrivacyGuard", "CallPrivacy", "REDACTED_FLAG", "ScanTooLargeError", "scan_cost_us"]


class ScanTooLargeError(UserError):
    """A request whose estimated scan is over :attr:`~agentforge.privacy.config.PrivacyConfig.max_scan_s`: the
    gateway answers 413 with this message and neither forwards nor stores the request."""


#: the flag (and ``not_trainable_reason``) of a span whose ids were withheld in ``redact`` mode
REDACTED_FLAG = "privacy_redacted"

_DETECTORS: dict[str, Future[Detector]] = {}
_DETECTORS_LOCK = threading.Lock()


def scan_cost_us(text: str) -> float:
    """The detector's estimated cost of scanning ``text``, µs: 0.12 µs a character plus 40 µs a digit
    (``phonenumbers`` tries every window of a digit run), the worst measured: digit groups with separators,
    30-37 ms per KB (``python benchmarks/privacy_detection.py --scaling``; a customer message: 3 ms per KB)."""
    return 0.12 * len(text) + 40.0 * digit_count(text)


def _texts(body: dict[str, Any]) -> list[str]:
    """Every free-text field of ``body`` that the masker scans (:func:`_walk_texts`)."""
    out: list[str] = []

    def keep(text: str, _is_json: bool) -> str:
        out.append(text)
        return text

    _walk_texts(body, keep)
    return out


def _placeholders(text: str) -> set[str]:
    return {m.group(0) for m in PLACEHOLDER_RE.finditer(text)} if "<" in text else set()


def _detector(config: PrivacyConfig) -> Future[Detector]:
    """The policy's detector, built once per process in a background thread (1.3 s on 2 cores: Presidio imports
    spaCy; :func:`~agentforge.privacy.detect._import_presidio` keeps its unused NLP engines' torch and transformers
    out), so a gateway starts at once and its first masked call waits for the build, off the event loop.

    Raises:
        MissingExtraError: a detection library is not installed (checked here, before the thread starts).
    """
    with _DETECTORS_LOCK:
        key = config.model_dump_json(exclude={"mode", "max_rollouts"})
        found = _DETECTORS.get(key)
        if found is None:
            for module in _DETECTION_MODULES:
                if importlib.util.find_spec(module) is None:
                    raise MissingExtraError(module, None, "privacy detection")
            found = _DETECTORS[key] = Future()
            threading.Thread(
                target=_build, args=(found, config), name="privacy-detector", daemon=True
            ).start()
        return found


#: a ``<`` in an SSE event's bytes, raw or JSON-escaped: where a placeholder (``<CARD_1>``) could begin
_LT_RE = re.compile(rb"<|\\u003[cC]")


def _cannot_hold_placeholder(event: bytes) -> bool:
    return _LT_RE.search(event) is None


#: the libraries :class:`~agentforge.privacy.detect.Detector` imports
_DETECTION_MODULES = ("presidio_analyzer", "phonenumbers", "detect_secrets")


def _build(future: Future[Detector], config: PrivacyConfig) -> None:
    try:
        future.set_result(Detector(config))
    except BaseException as exc:  # noqa: BLE001 - handed to every caller that waits on the detector
        future.set_exception(exc)


#: the free-text fields of a content part (its other fields are types, URLs and encoded media)
_PART_TEXT_KEYS = ("text", "refusal", "transcript", "filename")


def _walk_texts(body: dict[str, Any], fn: Callable[[str, bool], str]) -> dict[str, Any]:
    """A copy of ``body`` with ``fn(text, is_json)`` applied to every free-text field a person's data can be in.

    Each message's text content, the text fields of its content parts (``text``, ``refusal``,
    ``transcript``, ``filename``), its ``name`` and ``refusal``, its tool-call arguments (JSON); every
    ``description`` in the tools' schemas; the prompt (string or list of strings) and ``suffix``; the
    request's ``user``, the values of its ``metadata``, a predicted output's text (``prediction``) and every
    string of vLLM's ``documents``. The same fields on every route: a chat body sent to the completions route
    (a 400) is stored masked too. Names the engine matches on (tool and function names, enum values, roles,
    model) are left as they are.
    """
    out = dict(body)
    if isinstance(body.get("user"), str):
        out["user"] = fn(body["user"], False)
    if isinstance(body.get("messages"), list):
        messages = []
        for message in body["messages"]:
            if not isinstance(message, dict):
                messages.append(message)
                continue
            m = dict(message)
            content = m.get("content")
            if isinstance(content, str):
                m["content"] = fn(content, False)
            elif isinstance(content, list):
                m["content"] = [_part_with(p, fn) for p in content]
            for key in ("name", "refusal"):
                if isinstance(m.get(key), str):
                    m[key] = fn(m[key], False)
            calls = m.get("tool_calls")
            if isinstance(calls, list):
                m["tool_calls"] = [_call_with(c, fn) for c in calls]
            messages.append(m)
        out["messages"] = messages
    if isinstance(body.get("tools"), list):
        out["tools"] = [_descriptions(t, fn) for t in body["tools"]]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        out["prompt"] = fn(prompt, False)
    elif isinstance(prompt, list):
        out["prompt"] = [fn(p, False) if isinstance(p, str) else p for p in prompt]
    if isinstance(body.get("suffix"), str):
        out["suffix"] = fn(body["suffix"], False)
    metadata = body.get("metadata")
    if isinstance(metadata, dict):  # OpenAI's metadata: string values a client tags the call with
        out["metadata"] = {k: fn(v, False) if isinstance(v, str) else v for k, v in metadata.items()}
    prediction = body.get("prediction")
    if isinstance(prediction, dict):  # a predicted output: its content is text the engine reads
        content = prediction.get("content")
        if isinstance(content, str):
            out["prediction"] = {**prediction, "content": fn(content, False)}
        elif isinstance(content, list):
            out["prediction"] = {**prediction, "content": [_part_with(p, fn) for p in content]}
    if isinstance(body.get("documents"), list):  # vLLM's retrieval documents, rendered into the prompt
        out["documents"] = [_every_string(d, fn) for d in body["documents"]]
    return out


def _mask_split_values(
    mapping: Mapping, body: dict[str, Any], counts: Counter[str], issued: set[str]
) -> dict[str, Any]:
    """``body`` (masked chat) with values split across two of the person's messages masked too: each user
    message's text and the next user message's (other roles may come between), :meth:`Mapping.split_value`."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body
    users = [
        i
        for i, m in enumerate(messages)
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    ]
    if len(users) < 2:
        return body
    out = list(messages)
    for i, j in itertools.pairwise(users):
        found = mapping.split_value(out[i]["content"], out[j]["content"])
        if found is None:
            continue
        ph, keep, skip = found
        out[i] = {**out[i], "content": out[i]["content"][:keep] + ph}
        out[j] = {**out[j], "content": ph + out[j]["content"][skip:]}
        counts[ph[1:].rsplit("_", 1)[0]] += 1
        issued.add(ph)
    return {**body, "messages": out}


def _part_with(part: Any, fn: Callable[[str, bool], str], depth: int = 0) -> Any:
    """A content part with ``fn`` applied to its free-text fields, also one object down (a chat ``file`` part
    keeps its ``filename`` in ``part["file"]``, an audio part its ``transcript`` in ``part["input_audio"]``)."""
    if not isinstance(part, dict):
        return part
    out = {}
    for k, v in part.items():
        if k in _PART_TEXT_KEYS and isinstance(v, str):
            out[k] = fn(v, False)
        elif isinstance(v, dict) and depth == 0:
            out[k] = _part_with(v, fn, 1)
        else:
            out[k] = v
    return out


def _descriptions(value: Any, fn: Callable[[str, bool], str], depth: int = 0) -> Any:
    """A tool (or schema) with ``fn`` applied to every ``description`` string in it (nesting bounded)."""
    if depth > 32:
        return value
    if isinstance(value, dict):
        return {
            k: fn(v, False) if k == "description" and isinstance(v, str) else _descriptions(v, fn, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_descriptions(v, fn, depth + 1) for v in value]
    return value


def _call_with(call: Any, fn: Callable[[str, bool], str]) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = fn(function["arguments"], True)
    return {**call, "function": function}


class CallPrivacy:
    """What one call was masked with, and how its answer and its stored record are rewritten.

    Attributes:
        mode: the policy's mode.
        mapping: the rollout's placeholders (``mask``), or this call's findings (``redact``).
        counts: redactions in this call per category (the request's; ``seal`` adds the answer's).
        revealable: the placeholders whose values this call's request carried (masked by the gateway): the
            only ones its answer turns back into values. A caller who sends ``say <EMAIL_1>`` without the
            address gets ``<EMAIL_1>`` back, not the address another call of the rollout sent (issue 36).
    """

    def __init__(
        self,
        mode: PrivacyMode,
        mapping: Mapping,
        counts: Counter[str],
        exportable: bool = True,
        revealable: frozenset[str] = frozenset(),
    ) -> None:
        self.mode, self.mapping, self.counts, self.exportable = mode, mapping, counts, exportable
        self.revealable = revealable
        self._held: dict[tuple[Any, ...], str] = {}

    def _restore(self, text: str, in_json: bool = False) -> str:
        return self.mapping.restore(text, in_json=in_json, only=self.revealable)

    # --- the client's answer (mask mode) ---------------------------------------------------------
    def restore_body(self, data: dict[str, Any]) -> dict[str, Any]:
        """A unary answer (chat or completions, OpenAI's shape) with the real values back."""
        if self.mode is not PrivacyMode.mask:
            return data
        out = dict(data)
        choices = []
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                choices.append(choice)
                continue
            c = dict(choice)
            if isinstance(c.get("text"), str):
                c["text"] = self._restore(c["text"])
            message = c.get("message")
            if isinstance(message, dict):
                c["message"] = self._restore_message(message)
            choices.append(c)
        out["choices"] = choices
        return out

    def _restore_message(self, message: dict[str, Any]) -> dict[str, Any]:
        m = dict(message)
        if isinstance(m.get("content"), str):
            m["content"] = self._restore(m["content"])
        if isinstance(m.get("tool_calls"), list):
            m["tool_calls"] = [_call_with(c, lambda s, _j: self._restore(s, True)) for c in m["tool_calls"]]
        return m

    def restore_chunk(self, chunk: dict[str, Any]) -> dict[str, Any]:
        """One streamed chunk with the real values back; a placeholder split across chunks is held back
        until it is whole (or the choice finishes)."""
        out = dict(chunk)
        choices = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                choices.append(choice)
                continue
            c, index = dict(choice), choice.get("index", 0)
            final = c.get("finish_reason") is not None
            if isinstance(c.get("text"), str) or (final and ("text",) + (index,) in self._held):
                c["text"] = self._feed(("text", index), c.get("text") or "", final, False)
            delta = c.get("delta")
            if isinstance(delta, dict):
                d = dict(delta)
                if isinstance(d.get("content"), str) or (final and ("content", index) in self._held):
                    d["content"] = self._feed(("content", index), d.get("content") or "", final, False)
                if isinstance(d.get("tool_calls"), list):
                    d["tool_calls"] = [self._tool_delta(index, t, final) for t in d["tool_calls"]]
                c["delta"] = d
            choices.append(c)
        out["choices"] = choices
        return out

    def _tool_delta(self, index: Any, call: Any, final: bool) -> Any:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            return call
        function = dict(call["function"])
        if isinstance(function.get("arguments"), str):
            key = ("arguments", index, call.get("index", 0))
            function["arguments"] = self._feed(key, function["arguments"], final, True)
        return {**call, "function": function}

    def _feed(self, key: tuple[Any, ...], text: str, final: bool, in_json: bool) -> str:
        text = self._held.pop(key, "") + text
        if not final:
            text, held = split_open_tail(text)
            if held:
                self._held[key] = held
        return self._restore(text, in_json)

    async def restore_sse(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The gateway's SSE bytes (whole ``data: ...`` events per item) with the real values back.

        An event that cannot hold a placeholder (no ``<``, raw or JSON-escaped) while no placeholder's start is
        held back is passed on as it came (most events: decoding and re-encoding each cost more CPU than the
        rest of a streamed call's privacy work).
        """
        try:
            async for block in events:
                out = []
                for event in block.split(b"\n\n"):
                    if not event.startswith(b"data: {") or (
                        not self._held and _cannot_hold_placeholder(event)
                    ):
                        out.append(event)
                        continue
                    chunk = json.loads(event[6:])  # stdlib json: keeps NaN/Infinity logprobs as sent
                    restored = json.dumps(
                        self.restore_chunk(chunk), ensure_ascii=False, separators=(",", ":")
                    )
                    out.append(b"data: " + restored.encode())
                yield b"\n\n".join(out)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    # --- the stored record ------------------------------------------------------------------------
    def seal(self, llm: LLMCall) -> tuple[LLMCall, dict[str, Any]]:
        """The call as it is stored, and the span attributes that count its redactions.

        ``mask``: the call is stored as the engine saw it (placeholders only). ``redact``: request and
        answer text are redacted (``[CARD]``); when anything was redacted the token ids and logprobs are
        withheld and the call is not trainable (flag :data:`REDACTED_FLAG`).
        """
        counts = Counter(self.counts)
        if self.mode is PrivacyMode.redact:
            llm, answer_counts = _redact_call(llm, self.mapping)
            counts.update(answer_counts)
        attributes: dict[str, Any] = {
            "privacy": {"mode": self.mode.value, "redactions": dict(sorted(counts.items()))}
        }
        if counts and not self.exportable:  # exports refuse it (agentforge.privacy.ledger.must_stay)
            attributes["privacy"]["exportable"] = False
        if self.mode is PrivacyMode.redact and counts:
            llm = llm.model_copy(
                update={
                    "prompt_token_ids": None,
                    "completion_token_ids": None,
                    "logprobs": None,
                    "trainable": False,
                    "flags": [*llm.flags, REDACTED_FLAG],
                }
            )
            attributes["not_trainable_reason"] = REDACTED_FLAG
        return llm, attributes


def _redact_call(llm: LLMCall, mapping: Mapping) -> tuple[LLMCall, Counter[str]]:
    counts: Counter[str] = Counter()

    def redact(text: str, _is_json: bool) -> str:
        out, at = [], 0
        for f in mapping.detector.find(text):
            out += [text[at : f.start], f"[{f.category}]"]
            counts[f.category] += 1
            at = f.end
        return "".join(out) + text[at:]

    request = _every_string(llm.request, redact)  # messages, tool results, tool schemas: all of it
    text = redact(llm.response_text, False)
    calls = []
    for call in llm.tool_calls:
        arguments = redact(call.arguments, True)
        try:
            parsed = json.loads(arguments) if call.parsed is not None else None
        except ValueError:
            parsed = None
        calls.append(call.model_copy(update={"arguments": arguments, "parsed": parsed}))
    return llm.model_copy(update={"request": request, "response_text": text, "tool_calls": calls}), counts


def _every_string(value: Any, fn: Callable[[str, bool], str]) -> Any:
    """A copy of a JSON value with ``fn`` applied to every string in it."""
    if isinstance(value, str):
        return fn(value, False)
    if isinstance(value, list):
        return [_every_string(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _every_string(v, fn) for k, v in value.items()}
    return value


class PrivacyGuard:
    """The gateway's privacy policy at work: one in-memory mapping per rollout (least recently used go).

    Args:
        config: the policy; its detectors are built in a background thread (seconds, once per process and
            policy): the first call that needs them waits for the build in a worker thread, never on the event
            loop.

    Raises:
        MissingExtraError: a detection library is missing (``presidio-analyzer``, ``phonenumbers``,
            ``detect-secrets``).
    """

    #: scans that may run at once in worker threads (one request's scan is single-threaded Python; more threads
    #: than this would only queue on the interpreter lock, and would take the threads other hops need)
    SCAN_THREADS = 4
    #: scans estimated at most this many µs run on the event loop (:meth:`abegin`)
    INLINE_SCAN_US = 2000.0

    def __init__(self, config: PrivacyConfig) -> None:
        self.config = config
        self._building = _detector(config) if config.mode is not PrivacyMode.off else None
        self._rollouts: OrderedDict[str, Mapping] = OrderedDict()
        self._rollouts_lock = threading.Lock()
        self._threads = anyio.CapacityLimiter(self.SCAN_THREADS)

    @property
    def detector(self) -> Detector | None:
        """The policy's detector (``None`` when privacy is off); waits for its build if it is still running.

        Raises:
            MissingExtraError: the build failed for a missing library (every call then fails the same way).
        """
        return self._building.result() if self._building is not None else None

    async def ready(self) -> None:
        """Wait, in a worker thread, until the detector is built (at once when privacy is off or it is built)."""
        if self._building is not None and not self._building.done():
            await anyio.to_thread.run_sync(self._building.result)

    async def abegin(
        self, rollout_id: str | None, endpoint: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], CallPrivacy | None]:
        """:meth:`begin`, in a worker thread unless its scan is small, so the event loop keeps serving.

        Detection is pure Python: about 0.12 µs per character plus up to 40 µs per digit (``phonenumbers`` tries
        every window of a digit run; ``benchmarks/privacy_detection.py``). On the event loop a 400 KB body of
        ``"4111 "`` held ``/health`` for 16 s (issue 36). Texts the rollout's mapping has scanned before cost
        nothing; when the rest is estimated at most :attr:`INLINE_SCAN_US` it runs here (a thread hop costs
        more CPU than such a scan), else in a worker thread, at most :attr:`SCAN_THREADS` at once.
        """
        if self._building is None:
            return body, None
        estimate = self._scan_estimate_us(rollout_id, body)
        if estimate > self.config.max_scan_s * 1e6:
            raise ScanTooLargeError(
                f"this request would take the privacy scan about {estimate / 1e6:.0f} s (its texts hold "
                f"{sum(digit_count(t) for t in _texts(body)):,} digits); the gateway's limit is "
                f"max_scan_s={self.config.max_scan_s:g} s: send less text per request, or raise the limit "
                "(PrivacyConfig(max_scan_s=...))"
            )
        await self.ready()
        if self.config.mode is PrivacyMode.mask and estimate > self.INLINE_SCAN_US:
            return await anyio.to_thread.run_sync(
                self.begin, rollout_id, endpoint, body, limiter=self._threads
            )
        return self.begin(rollout_id, endpoint, body)

    def _scan_estimate_us(self, rollout_id: str | None, body: dict[str, Any]) -> float:
        """The detector's estimated cost (µs) for the texts of ``body`` its rollout has not scanned yet."""
        mapping = self._rollouts.get(rollout_id) if rollout_id is not None else None
        total = 0.0

        def cost(text: str, _is_json: bool) -> str:
            nonlocal total
            if mapping is None or not mapping.is_cached(text):
                total += scan_cost_us(text)
            return text

        _walk_texts(body, cost)
        return total

    async def amask_answer(
        self,
        rollout_id: str | None,
        privacy: CallPrivacy | None,
        llm: LLMCall,
        tokens: EngineTokens | None,
    ) -> tuple[LLMCall, CallPrivacy | None, dict[str, Any]]:
        """In ``mask`` mode: the answered call with the personal data the model wrote masked, as it is stored and
        as a continuation shows it to the engine (:mod:`agentforge.privacy.answer`).

        The answer's text and tool-call arguments are scanned (in a worker thread when the scan is estimated
        over :attr:`INLINE_SCAN_US`); a value found joins the rollout's mapping, so the client's echo of the
        answer masks to the same placeholder.

        Args:
            rollout_id: the call's rollout (``None``: a mapping of the call's own).
            privacy: what the request's masking did (``None``: it found nothing).
            llm: the call as the engine answered it.
            tokens: the serving engine's tokenizer routes, or ``None``.

        Returns:
            ``(call, privacy, span attributes)``: unchanged when nothing was found or the mode is not ``mask``;
            otherwise the masked call, the call's :class:`CallPrivacy` (made here when the request had none;
            its counts include the answer's) and the attributes :func:`~agentforge.privacy.answer.answer_ids`
            gave.
        """
        if self._building is None or self.config.mode is not PrivacyMode.mask:
            return llm, privacy, {}
        await self.ready()
        texts = [t for t in answer_texts(llm) if t]
        if not texts:
            return llm, privacy, {}
        known = privacy.mapping if privacy is not None else None
        if known is None and rollout_id is not None:
            known = self._rollouts.get(rollout_id)
        estimate = sum(scan_cost_us(t) for t in texts)
        if estimate > self.INLINE_SCAN_US:
            found = await anyio.to_thread.run_sync(self._answer_has_data, known, texts, limiter=self._threads)
        else:
            found = self._answer_has_data(known, texts)
        if not found:
            return llm, privacy, {}
        if privacy is None:
            privacy = CallPrivacy(
                self.config.mode, self._mapping(rollout_id), Counter(), self.config.exportable
            )
        mapping = privacy.mapping

        def locked(fn: Callable[[], Any]) -> Any:
            with mapping.lock:
                return fn()

        async def run(fn: Callable[[], Any], cost_us: float) -> Any:  # a big scan goes to a worker thread
            if cost_us > self.INLINE_SCAN_US:
                return await anyio.to_thread.run_sync(locked, fn, limiter=self._threads)
            return locked(fn)

        async def mask_text(text: str) -> tuple[str, Counter[str]]:
            return await run(lambda: mapping.mask(text), scan_cost_us(text))

        masked, counts = await run(lambda: mask_answer_text(mapping, llm), estimate)
        privacy.counts.update(counts)
        masked, attributes = await answer_ids(masked, llm, mask_text, tokens)
        return masked, privacy, attributes

    def _answer_has_data(self, known: Mapping | None, texts: list[str]) -> bool:
        assert self.detector is not None
        if known is not None and known.by_value and any(known.known_in(t) for t in texts):
            return True
        return any(self.detector.find(t) for t in texts)

    async def aseal(self, privacy: CallPrivacy, llm: LLMCall) -> tuple[LLMCall, dict[str, Any]]:
        """:meth:`CallPrivacy.seal` off the event loop where it scans (``redact`` mode scans the answer)."""
        if privacy.mode is not PrivacyMode.redact:
            return privacy.seal(llm)
        return await anyio.to_thread.run_sync(privacy.seal, llm, limiter=self._threads)

    def begin(
        self, rollout_id: str | None, endpoint: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], CallPrivacy | None]:
        """Mask one request.

        Args:
            rollout_id: the call's rollout (its mapping is shared by the rollout's calls); ``None``: the call
                gets a mapping of its own.
            endpoint: ``"chat"`` or ``"completions"``.
            body: the validated request body (not modified).

        Returns:
            ``(body the engine gets, CallPrivacy)``; ``(body, None)`` when privacy is off or nothing was
            found in a rollout never masked before (the body is then forwarded untouched: no cost later).
        """
        if self.detector is None:
            return body, None
        mapping = self._mapping(rollout_id)
        counts: Counter[str] = Counter()
        issued: set[str] = set()  # placeholders standing for values this request carried

        def mask(text: str, _is_json: bool) -> str:
            masked, found = mapping.mask(text)
            if found:
                counts.update(found)
                issued.update(_placeholders(masked) - _placeholders(text))
            return masked

        if self.config.mode is PrivacyMode.redact:  # the engine sees the values; seal redacts the record
            return body, CallPrivacy(self.config.mode, mapping, counts, self.config.exportable)
        with mapping.lock:  # a rollout's concurrent calls (parallel tool branches) share its placeholders
            masked = _walk_texts(body, mask)
            if endpoint == "chat":
                masked = _mask_split_values(mapping, masked, counts, issued)
        if not counts and not mapping.by_value:
            return body, None
        return masked, CallPrivacy(
            self.config.mode, mapping, counts, self.config.exportable, frozenset(issued)
        )

    def _mapping(self, rollout_id: str | None) -> Mapping:
        assert self.detector is not None
        if rollout_id is None:
            return Mapping(self.detector)
        with self._rollouts_lock:  # begin runs in worker threads
            found = self._rollouts.get(rollout_id)
            if found is None:
                found = self._rollouts[rollout_id] = Mapping(self.detector)
                while len(self._rollouts) > self.config.max_rollouts:
                    self._rollouts.popitem(last=False)
            else:
                self._rollouts.move_to_end(rollout_id)
            return found
