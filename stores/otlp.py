"""Export what a SQL store commits to an OpenTelemetry collector over OTLP, off every caller's path.

Switched on by the standard OpenTelemetry environment: :func:`agentforge.open.open_store` attaches an
:class:`OTLPExport` to every SQL store it opens while ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and neither ``OTEL_SDK_DISABLED=true`` nor an ``OTEL_TRACES_EXPORTER``
without ``otlp`` says otherwise); :func:`export_to_otlp` attaches one in code. The process that commits a record
exports it: a store server (or a gateway that mounts the store API) exports for every client of it.

The hook is the store's write side (:class:`~agentforge.stores.sql_rollouts.CommitListener`): once a batch is
committed and its callers answered, the writer thread appends the stored spans and rewards to a bounded queue (an
``O(1)`` append each), finished attempts and rollouts as ids. One export thread per store takes up to
``max_export_batch_size`` records every ``schedule_delay_s`` (or once a batch is full), builds their spans
(:mod:`agentforge.stores.otel_spans`) and hands them to the SDK's OTLP exporter (HTTP/protobuf, or gRPC with
``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``), which retries for up to its timeout (``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s).

Nothing waits on the collector: a full queue drops the newest records, a batch the exporter gave up on is dropped,
and both are counted (:meth:`OTLPExport.metrics`, served as ``agentforge_otlp_*`` counters on the store API's
``GET /api/store/metrics``) and logged as a warning at most once a minute. The queue and batch sizes follow the
SDK's batch processor settings (``OTEL_BSP_MAX_QUEUE_SIZE`` 2048, ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` 512,
``OTEL_BSP_SCHEDULE_DELAY`` 5000 ms); the SDK's own ``BatchSpanProcessor`` is not used because it would build
each span on the committing thread and counts its drops only in an opt-in internal metric.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentforge.errors import ConfigError, MissingExtraError
from agentforge.types import Reward, Span

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from agentforge.stores.sql import SQLStore

__all__ = ["OTLPSettings", "OTLPExport", "export_to_otlp", "otlp_settings_from_env"]

logger = logging.getLogger("agentforge.stores.otlp")

Protocol = Literal["http/protobuf", "grpc"]
_EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}
_PACKAGES = {
    "opentelemetry.sdk.trace": "opentelemetry-sdk",
    _EXPORTERS["http/protobuf"]: "opentelemetry-exporter-otlp-proto-http",
    _EXPORTERS["grpc"]: "opentelemetry-exporter-otlp-proto-grpc",
}
_TRUE = ("true", "1", "yes", "on")
_WARN_EVERY_S = 60.0
_REMEMBERED = 65536  # finished attempts and rollouts remembered, so each is exported once


@dataclass(frozen=True)
class OTLPSettings:
    """Where and how spans are exported.

    Attributes:
        endpoint: the collector's base URL (``http://host:4318`` for OTLP/HTTP, ``http://host:4317`` for gRPC);
            ``None``: the exporter reads ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``
            (and headers, certificates, compression and timeout) from the environment itself.
        protocol: ``"http/protobuf"`` (the OTLP default) or ``"grpc"``.
        timeout_s: the exporter's limit for one batch, retries included, seconds (``None``: its default, 10 s).
        max_queue_size: records waiting for export at most; more are dropped and counted.
        max_export_batch_size: records per export request at most.
        schedule_delay_s: the longest a record waits before its batch is sent, seconds.
        capture_content: also export message text, tool arguments and results (``gen_ai.input.messages`` …).
        service_name: ``service.name`` of the spans unless ``OTEL_SERVICE_NAME`` sets one.
    """

    endpoint: str | None = None
    protocol: Protocol = "http/protobuf"
    timeout_s: float | None = None
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_s: float = 5.0
    capture_content: bool = False
    service_name: str = "agentforge"

    def __post_init__(self) -> None:
        if self.protocol not in _EXPORTERS:
            raise ConfigError(
                f"OTLP protocol {self.protocol!r} is not supported; use one of {sorted(_EXPORTERS)}"
            )
        if self.max_queue_size < 1 or not 1 <= self.max_export_batch_size <= self.max_queue_size:
            raise ConfigError(
                f"OTLP export needs 1 <= max_export_batch_size ({self.max_export_batch_size}) <= max_queue_size "
                f"({self.max_queue_size})"
            )
        if self.schedule_delay_s <= 0 or (self.timeout_s is not None and self.timeout_s <= 0):
            raise ConfigError(
                f"OTLP schedule delay ({self.schedule_delay_s} s) and timeout ({self.timeout_s} s) must be > 0"
            )


def otlp_settings_from_env(environ: dict[str, str] | None = None) -> OTLPSettings | None:
    """The export the standard OpenTelemetry variables ask for, or ``None`` when they ask for none.

    Read: ``OTEL_SDK_DISABLED``, ``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
    ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``, ``OTEL_BSP_MAX_QUEUE_SIZE``, ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``,
    ``OTEL_BSP_SCHEDULE_DELAY`` (milliseconds) and ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.

    Args:
        environ: the variables (default ``os.environ``).

    Returns:
        Settings whose ``endpoint`` is ``None`` (the exporter resolves it from the same variables), or ``None``.

    Raises:
        ConfigError: a variable holds a value that is not a number or not a supported protocol.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return None
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters and "otlp" not in {e.strip() for e in exporters.split(",")}:
        return None
    if not (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )

    def number(name: str, default: float) -> float:
        raw = env.get(name, "").strip()
        try:
            return float(raw) if raw else default
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number") from None

    return OTLPSettings(
        protocol=protocol.strip(),  # type: ignore[arg-type]  # checked by __post_init__
        max_queue_size=int(number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)),
        max_export_batch_size=int(number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
        schedule_delay_s=number("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000,
        capture_content=env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").lower() in _TRUE,
    )


def export_to_otlp(store: SQLStore, settings: OTLPSettings | None = None) -> OTLPExport | None:
    """Export everything ``store`` commits from now on (see the module docstring).

    Args:
        store: a SQL store (it gets the export as its ``listener``; its ``close`` flushes and stops it).
        settings: the export; ``None``: :func:`otlp_settings_from_env` (nothing is attached when that is ``None``).

    Returns:
        The attached export, or ``None`` when the environment asks for none.

    Raises:
        MissingExtraError: the OpenTelemetry SDK or the protocol's exporter is not installed.
        ConfigError: see :func:`otlp_settings_from_env`.
    """
    settings = settings if settings is not None else otlp_settings_from_env()
    if settings is None:
        return None
    export = OTLPExport(store, settings)
    store.listen(export)
    return export


class OTLPExport:
    """The export of one store: a bounded queue, one export thread, counters (see the module docstring).

    Args:
        store: where finished attempts and rollouts are read back from (by the export thread).
        settings: see :class:`OTLPSettings`.
        exporter: the SDK ``SpanExporter`` to send to (default: the OTLP exporter of ``settings.protocol``);
            built on the export thread.

    Raises:
        MissingExtraError: the OpenTelemetry SDK or the protocol's exporter is not installed.
    """

    def __init__(self, store: SQLStore, settings: OTLPSettings, exporter: SpanExporter | None = None) -> None:
        for module in ["opentelemetry.sdk.trace"] + ([] if exporter else [_EXPORTERS[settings.protocol]]):
            if not _installed(module):
                raise MissingExtraError(_PACKAGES[module], "otel", "OTLP export")
        self.settings, self._store, self._exporter = settings, store, exporter
        self._cond = threading.Condition()
        self._queue: deque[Span | Reward | str] = deque()
        self._thread: threading.Thread | None = None
        self._pid, self._closed = os.getpid(), False
        self._accepted = self._done = self._flush_to = 0
        self._counts: dict[str, int] = dict.fromkeys(
            ("exported", "dropped_queue_full", "dropped_export_failed", "build_errors"), 0
        )
        self._warned_at = 0.0
        self._sent: OrderedDict[str, None] = OrderedDict()  # attempts and rollouts already exported
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the store's side (CommitListener): O(1) per record, never blocks ------------------------------
    def committed(self, items: Sequence[Span | Reward]) -> None:
        """Queue a committed batch of spans and rewards (called on the store's writer thread)."""
        self._offer(items)

    def rollouts_changed(self, rollout_ids: Sequence[str]) -> None:
        """Queue rollouts whose attempts or state changed; their finished parts are exported once."""
        self._offer(rollout_ids)

    def _offer(self, records: Sequence[Span | Reward | str]) -> None:
        with self._cond:
            if self._closed:
                return
            if self._pid != os.getpid():  # a forked child: the parent's thread and queue are not ours
                self._pid, self._thread, self._queue = os.getpid(), None, deque()
            room = self.settings.max_queue_size - len(self._queue)
            taken = records if len(records) <= room else records[: max(room, 0)]
            self._queue.extend(taken)
            self._accepted += len(taken)
            dropped = len(records) - len(taken)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentforge-otlp-export", daemon=True)
                self._thread.start()
            if len(self._queue) >= self.settings.max_export_batch_size:
                self._cond.notify()
        if dropped:
            self._count("dropped_queue_full", dropped)

    # --- what an operator reads ----------------------------------------------------------------------
    def metrics(self) -> dict[str, int]:
        """Counters: ``exported`` (spans the collector took), ``dropped_queue_full`` (records the full queue
        refused), ``dropped_export_failed`` (spans of batches the exporter gave up on), ``build_errors``, ``queued``."""
        with self._cond:
            return {**self._counts, "queued": len(self._queue)}

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export everything queued before this call now. Returns: whether it was done within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._flush_to = self._accepted
            self._cond.notify_all()
            while self._done < target and self._thread is not None and self._thread.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._done >= target

    def close(self, timeout_s: float = 10.0) -> None:
        """Export what is queued (waiting at most ``timeout_s`` seconds), then stop. Safe twice."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning(
                    "OTLP export: %d records still queued at close; they are dropped", len(self._queue)
                )

    # --- the export thread ---------------------------------------------------------------------------
    def _take(self) -> list[Span | Reward | str] | None:
        s = self.settings
        with self._cond:
            deadline = time.monotonic() + s.schedule_delay_s
            while (
                len(self._queue) < s.max_export_batch_size
                and not self._closed
                and self._done >= self._flush_to
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            if not self._queue and self._closed:
                return None
            return [self._queue.popleft() for _ in range(min(len(self._queue), s.max_export_batch_size))]

    def _run(self) -> None:
        from agentforge.stores.otel_spans import SpanBuilder

        try:
            builder = SpanBuilder(self._resource(), self.settings.capture_content)
            exporter = self._exporter or _make_exporter(self.settings)
        except Exception:  # e.g. a certificate file that is not there: nothing can be sent, all is counted
            logger.exception("OTLP export: the exporter could not be built; every span is dropped")
            builder = exporter = None
        try:
            while (batch := self._take()) is not None:
                if batch and exporter is not None:
                    self._export(builder, exporter, batch)
                elif batch:
                    self._count("dropped_export_failed", len(batch))
                with self._cond:
                    self._done += len(batch)
                    self._cond.notify_all()
        finally:
            if exporter is not None:
                exporter.shutdown()

    def _export(self, builder: Any, exporter: SpanExporter, batch: list[Span | Reward | str]) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        rollout_ids = list(dict.fromkeys(r for r in batch if isinstance(r, str)))
        for record in batch:
            if isinstance(record, str):
                continue
            try:
                (builder.span if isinstance(record, Span) else builder.reward)(record)
            except Exception:
                logger.exception("OTLP export: could not build the span of %r", record)
                self._count("build_errors", 1)
        for rollout_id in rollout_ids:
            try:
                self._finished_parts(builder, rollout_id)
            except Exception:
                logger.exception("OTLP export: could not read rollout %s back", rollout_id)
                self._count("build_errors", 1)
        spans = builder.take()
        if not spans:
            return
        try:
            ok = exporter.export(spans) is SpanExportResult.SUCCESS
        except Exception:
            logger.exception("OTLP export: the exporter raised")
            ok = False
        self._count("exported" if ok else "dropped_export_failed", len(spans))

    def _finished_parts(self, builder: Any, rollout_id: str) -> None:
        """Build the spans of the rollout's ended attempts and, once it is finished, of the rollout itself."""
        rollout = self._store.get_rollout(rollout_id)
        for attempt in self._store.list_attempts(rollout_id):
            if attempt.ended_at is not None and self._first_time(f"attempt:{attempt.attempt_id}"):
                builder.attempt(rollout, attempt)
        if rollout.state.finished and self._first_time(f"rollout:{rollout_id}"):
            builder.rollout(rollout, self._store.final_reward(rollout_id))

    def _first_time(self, key: str) -> bool:
        if key in self._sent:
            return False
        self._sent[key] = None
        if len(self._sent) > _REMEMBERED:
            self._sent.popitem(last=False)
        return True

    def _count(self, name: str, n: int) -> None:
        with self._cond:
            self._counts[name] += n
            counts = dict(self._counts)
            warn = name.startswith("dropped") and time.monotonic() - self._warned_at >= _WARN_EVERY_S
            if warn:
                self._warned_at = time.monotonic()
        if warn:
            logger.warning(
                "OTLP export is dropping spans (collector unreachable or too slow): %d refused by the full queue, "
                "%d in failed exports, %d exported so far",
                counts["dropped_queue_full"],
                counts["dropped_export_failed"],
                counts["exported"],
            )

    def _resource(self) -> Any:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource

        base = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: self.settings.service_name}
        return Resource.create(base)


def _make_exporter(settings: OTLPSettings) -> SpanExporter:
    """The SDK's OTLP span exporter for ``settings`` (environment-resolved when ``endpoint`` is ``None``)."""
    kwargs: dict[str, Any] = {}
    if settings.timeout_s is not None:
        kwargs["timeout"] = settings.timeout_s
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        if settings.endpoint:
            kwargs["endpoint"] = settings.endpoint
        return GrpcExporter(**kwargs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    if settings.endpoint:
        base = settings.endpoint.rstrip("/")
        kwargs["endpoint"] = base if base.endswith("/v1/traces") else base + "/v1/traces"
    return HttpExporter(**kwargs)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _close_at_exit(ref: weakref.ref[OTLPExport]) -> None:
    export = ref()
    if export is not None:
        export.close(timeout_s=5.0)
