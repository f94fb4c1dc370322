"""OpenTelemetry tracing, following its messaging semantic conventions: a publish is a PRODUCER
span (`publish <queue>`) whose W3C trace context (`traceparent`, `tracestate`: the global
propagator's fields) goes into each message's headers; a Worker's round that claims a message
is a CLIENT span (`receive <queue>`), a child of that context; its handler runs in a CONSUMER
span (`process <queue>`), a child of the receive span. So each message's trace reads
publish -> receive -> process, once per delivery.

It is on when OpenTelemetry's API is installed (the `otel` extra) and the application has set
a tracer provider (`opentelemetry.trace.set_tracer_provider`): the API alone does nothing,
and neither does this module then. Without the API installed nothing here imports it: the
transport's hook is None and the hot paths test one attribute."""

from __future__ import annotations

import importlib.util
import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .types import Lease

SYSTEM = "rqlite-queue"
"""`messaging.system`."""
TRACER = "rqlite_queue"
"""The instrumentation scope's name."""

_api: Any = None
"""The OpenTelemetry API, once imported (False: not installed)."""
_tracer: tuple[object, Any] | None = None
"""(the tracer provider, its tracer for this library)."""
_recheck_at = 0.0
RECHECK = 1.0
"""Seconds between two looks for a tracer provider while none is set."""


def installed() -> bool:
    """Whether the OpenTelemetry API can be imported (found without importing it)."""
    return importlib.util.find_spec("opentelemetry") is not None


def hook() -> Callable[[], Mapping[str, str] | None] | None:
    """What a transport's core calls for the trace context to add to each message checked
    (`QueueCore.trace_headers`): None when OpenTelemetry is not installed."""
    return context_headers if installed() else None


def _load() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import context, propagate, trace
            from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
        except ImportError:
            _api = False
        else:

            class Api:
                pass

            api = Api()
            for name, value in {
                "context": context,
                "propagate": propagate,
                "trace": trace,
                "ProxyTracerProvider": ProxyTracerProvider,
                "SpanKind": SpanKind,
                "Status": Status,
                "StatusCode": StatusCode,
            }.items():
                setattr(api, name, value)
            _api = api
    return _api


def tracer() -> Any:
    """This library's tracer, or None while no tracer provider is set (or no API). Without
    one, the API's answer is asked again at most every RECHECK seconds: asking costs an
    environment lookup, too much for every publish."""
    global _tracer, _recheck_at
    if _tracer is None and time.monotonic() < _recheck_at:
        return None
    api = _load()
    if not api:
        _recheck_at = float("inf")
        return None
    provider = api.trace.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider):
        _tracer, _recheck_at = None, time.monotonic() + RECHECK
        return None
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer(TRACER))
    return _tracer[1]


def context_headers() -> dict[str, str] | None:
    """The trace context in force, as headers (the global propagator's), or None."""
    if tracer() is None:
        return None
    carrier: dict[str, str] = {}
    _api.propagate.inject(carrier)
    return carrier or None


def _attributes(queue: str, operation: str, kind: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
    }


def message_id(lease: Lease) -> str:
    """`messaging.message.id`: the seq (on a sharded queue, `shard/seq`: seqs are per shard)."""
    return f"{lease.shard}/{lease.seq}" if lease.shard else str(lease.seq)


def failed(span: Any, exc: BaseException) -> None:
    """The span ends in error: the exception recorded, its type as `error.type`."""
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(_api.Status(_api.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


@contextmanager
def _current(
    tr: Any, name: str, kind: Any, attributes: dict[str, Any], context: Any = None
) -> Iterator[Any]:
    with tr.start_as_current_span(
        name,
        context=context,
        kind=kind,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            failed(span, exc)
            raise


def publishing(queue: str, messages: Sequence[Any]) -> Any:
    """The span of a publish of `messages` (`messages.GivenMessage`), current while it runs (the
    messages checked within it carry its context), or None when tracing is off."""
    tr = tracer()
    if tr is None:
        return None
    attributes = _attributes(queue, "publish", "send")
    if len(messages) == 1:
        group = messages[0][0]  # (its group id: a `Message`, or a pair as given)
        if isinstance(group, str):
            attributes["messaging.message.conversation_id"] = group
    else:
        attributes["messaging.batch.message_count"] = len(messages)
    return _current(tr, f"publish {queue}", _api.SpanKind.PRODUCER, attributes)


def published(span: Any, seqs: Sequence[int]) -> None:
    if len(seqs) == 1:
        span.set_attribute("messaging.message.id", str(seqs[0]))


class Round:
    """A Worker's claim round, timed: once it returns, a receive span per message it claimed
    (each a child of its message's publish context, all with the round's start and end), or
    one span in error if it failed. Its `handler` runs a message's handler in its process
    span."""

    def __init__(self, tr: Any, queue: str, worker_id: str) -> None:
        self.tracer = tr
        self.queue = queue
        self.worker_id = worker_id
        self.started = time.time_ns()

    def _attributes(self, operation: str, lease: Lease | None = None) -> dict[str, Any]:
        attributes = _attributes(self.queue, operation, operation)
        attributes["messaging.client.id"] = self.worker_id
        if lease is not None:
            attributes["messaging.message.id"] = message_id(lease)
            attributes["messaging.message.conversation_id"] = lease.group_id
            attributes["messaging.rqlite_queue.message.attempts"] = lease.attempts
            if lease.shard:
                attributes["messaging.rqlite_queue.shard"] = lease.shard
        return attributes

    def failed(self, exc: BaseException) -> None:
        span = self.tracer.start_span(
            f"receive {self.queue}",
            kind=_api.SpanKind.CLIENT,
            attributes=self._attributes("receive"),
            start_time=self.started,
        )
        failed(span, exc)
        span.end()

    def received(self, leases: Sequence[Lease]) -> list[Any]:
        """The receive span's context of each lease, in order."""
        ended = time.time_ns()
        contexts = []
        for lease in leases:
            attributes = self._attributes("receive", lease)
            attributes["messaging.batch.message_count"] = len(leases)
            span = self.tracer.start_span(
                f"receive {self.queue}",
                context=_api.propagate.extract(lease.headers),
                kind=_api.SpanKind.CLIENT,
                attributes=attributes,
                start_time=self.started,
            )
            span.end(end_time=ended)
            contexts.append(_api.trace.set_span_in_context(span))
        return contexts

    def handler(
        self,
        handler: Callable[[Lease], Any],
        finish: Callable[[Any], Any] | None,
        lease: Lease,
        parent: Any,
        is_async: bool,
    ) -> Callable[[Lease], Any]:
        """`handler`, then `finish` on what it returned, in the lease's process span (a
        child of `parent`): an exception of either ends it in error."""
        name = f"process {self.queue}"
        kind = _api.SpanKind.CONSUMER
        attributes = self._attributes("process", lease)

        def then(result: Any) -> Any:
            return result if finish is None else finish(result)

        if is_async:

            async def run_async(given: Lease) -> Any:
                with _current(self.tracer, name, kind, attributes, parent):
                    return then(await handler(given))

            return run_async

        def run(given: Lease) -> Any:
            span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
            token = _api.context.attach(_api.trace.set_span_in_context(span, parent))
            try:
                result = handler(given)
                if inspect.isawaitable(result):
                    # A sync callable that returned an awaitable (AsyncWorker awaits it): the
                    # span ends once it has been awaited, on the event loop.
                    return _awaited(span, result, then)
                result = then(result)
            except BaseException as exc:
                failed(span, exc)
                span.end()
                raise
            finally:
                _api.context.detach(token)
            span.end()
            return result

        return run


async def _awaited(span: Any, awaitable: Any, then: Callable[[Any], Any]) -> Any:
    with _api.trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        try:
            return then(await awaitable)
        except BaseException as exc:
            failed(span, exc)
            raise


def claim_round(queue: str, worker_id: str) -> Round | None:
    """A claim round about to start, or None when tracing is off."""
    tr = tracer()
    return None if tr is None else Round(tr, queue, worker_id)
