"""The webhook ingress: an ASGI app (Starlette) that takes push deliveries over HTTP and hands
each one to :meth:`Engine.deliver`. ``cardfence serve`` runs it under uvicorn; a host application
can mount it (``Mount("/a2a", webhook_app(engine))``).

Routes:

- ``POST /webhook`` (``path``): one delivery. Checked before the body is read: ``Content-Length``
  over :data:`~cardfence.engine.wire.push.MAX_DELIVERY_BYTES` (413), a content type other than JSON
  (415), a repeated ``Content-Type``, token or ``Authorization`` header (400). The body is read
  chunk by chunk and refused (413) as soon as it passes the limit, with or without a
  ``Content-Length``: never more than the limit and one chunk is held. The engine then checks its
  shape and credentials (tokens compared as SHA-256 digests, in constant time) and applies it.
  What one app takes at once is bounded (:class:`IngressLimits`): a delivery beyond
  ``deliveries`` in flight is answered 503 with ``Retry-After`` before its body is read, and a
  body that takes longer than ``body_seconds`` to arrive is answered 408, so neither a flood nor
  a sender trickling its bodies holds more than ``deliveries`` bodies of 256 KiB, or holds them
  for long. A source (client address) that keeps sending what is refused -- forged credentials,
  unknown tasks, malformed bodies: each refused for its credentials or its task has cost a store
  lookup -- is shed once its budget of ``refusals`` is spent
  (:mod:`~cardfence.engine.serve._shedding`):
  its deliveries are answered 429 with ``Retry-After`` before anything is read, until it has room
  for one more. Its being shed is logged once a minute at most; the 429s are counted, not logged.
  Push is never the only way news arrives (the safety polls, R5), so a delivery refused for load
  delays a task's progress and loses nothing.
  The answer is ``Delivery.status`` with ``{"outcome": ..., "detail": ...}``; the detail never
  carries the token or ``Authorization`` presented. An event store that cannot be reached or
  fails answers 503 with ``Retry-After`` (the cause in the log, not in the answer), an unexpected
  error 500 with a generic detail; the store writes a transition in one transaction, so nothing
  is half-written. Other methods answer 405.
- ``GET /healthz``: ``{"status": "ok"}``, liveness only (it does not touch the store).
- ``GET /readyz``: ``{"status": "ready"}`` while the event store answers a read within 2 s, else
  503 ``{"status": "unavailable", ...}`` (the cause logged): readiness, for a load balancer.
- ``GET /metrics`` (only when asked for, ``metrics=``): counts in the Prometheus text format --
  deliveries answered by status and outcome, deliveries in flight, and what the sources given
  count (``cardfence serve --metrics`` adds its driver's).

``app.state.ingress.in_flight`` counts the deliveries admitted and not yet answered.

Every delivery decision is logged once on the ``cardfence.ingress`` logger, with ``task``,
``outcome``, ``status`` and ``reason`` also as record attributes (for structured handlers); no
secret is ever logged.

The app calls the engine on the event loop that serves it: serve it on the loop the engine was
opened on (``cardfence serve`` does; so does a host that opens the engine in its lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import Protocol

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from cardfence.engine.auth.redaction import redaction
from cardfence.engine.client.engine import Engine
from cardfence.engine.serve._metrics import CONTENT_TYPE, Family, render
from cardfence.engine.serve._shedding import RefusalBudget
from cardfence.engine.wire import push as webhook
from cardfence.engine.wire.push import MAX_DELIVERY_BYTES, TOKEN_HEADER, Delivery, IngressLimits
from cardfence.store.errors import CorruptRecordError, StoreUnavailableError

__all__ = [
    "HEALTH_PATH",
    "METRICS_PATH",
    "READY_PATH",
    "MetricsSource",
    "read_bounded",
    "webhook_app",
]

HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
_OTHER_PATHS = (HEALTH_PATH, READY_PATH, METRICS_PATH)
_SINGLE_HEADERS = ("content-type", TOKEN_HEADER, "authorization")
_SECRET_HEADERS = (TOKEN_HEADER, "authorization")
_REDACTED = "[redacted]"
_RETRY_AFTER = "1"  # seconds, in a 503's Retry-After
_READY_SECONDS = 2.0  # how long GET /readyz waits for the event store
_STORE_DOWN = "the event store is unavailable: nothing written; retry later"
# Refusals charged to their source's budget: the delivery's own faults (not 409: its credentials
# are genuine, only shared; nor 429, 503 or 500).
_CHARGED = frozenset({400, 401, 404, 408, 413, 415})
_log = logging.getLogger("cardfence.ingress")


class MetricsSource(Protocol):
    """Anything that describes what it counts (a :class:`~cardfence.engine.serve.driver.Driver`)."""

    def families(self) -> Iterable[Family]: ...


def webhook_app(
    engine: Engine,
    *,
    path: str = "/webhook",
    limits: IngressLimits | None = None,
    metrics: Iterable[MetricsSource] | None = None,
) -> Starlette:
    """An ASGI app taking push deliveries for ``engine`` at ``POST path`` (see the module).
    ``metrics``: serve ``GET /metrics`` with the app's own counts and those of these sources
    (``()`` for the app's alone); ``None``, the default: no such route."""
    if path in _OTHER_PATHS:
        raise ValueError(f"the webhook path cannot be {path}, which the app serves for GET")
    ingress = _Ingress(engine, limits or IngressLimits())

    async def deliveries(request: Request) -> Response:
        return await ingress.deliver(request)

    routes = [
        Route(path, deliveries, methods=["POST"]),
        Route(HEALTH_PATH, _health, methods=["GET"]),
        Route(READY_PATH, ingress.ready, methods=["GET"]),
    ]
    if metrics is not None:
        sources: list[MetricsSource] = [ingress, *metrics]

        async def exposition(_request: Request) -> Response:
            text = render(family for source in sources for family in source.families())
            return PlainTextResponse(text, media_type=CONTENT_TYPE)

        routes.append(Route(METRICS_PATH, exposition, methods=["GET"]))
    app = Starlette(routes=routes)
    app.state.ingress = ingress  # ``app.state.ingress.in_flight``: a gauge for metrics
    return app


async def read_bounded(chunks: AsyncGenerator[bytes, None], limit: int) -> bytes | None:
    """The body ``chunks`` make up, or ``None`` as soon as it passes ``limit`` bytes: reading
    stops there, so no more than ``limit`` bytes and one chunk are ever held."""
    body = bytearray()
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            body += chunk
            if len(body) > limit:
                return None
    return bytes(body)


async def _health(_request: Request) -> Response:
    return JSONResponse({"status": "ok"})


class _Ingress:
    """The deliveries of one app: admitted up to the limits, then read and applied.
    ``in_flight``: those admitted and not yet answered; ``answered``: every answer given, by
    status and outcome."""

    def __init__(self, engine: Engine, limits: IngressLimits) -> None:
        self.engine = engine
        self.limits = limits
        self.in_flight = 0  # every delivery is handled on the one event loop: no lock needed
        self.answered: Counter[tuple[int, str]] = Counter()
        self._readiness: asyncio.Future[bool] | None = None  # the last readiness check
        self.refusals = None if limits.refusals is None else RefusalBudget(limits.refusals)

    async def deliver(self, request: Request) -> Response:
        headers = request.headers
        source = request.client.host if request.client is not None else "-"
        budget = self.refusals
        if budget is not None and (wait := budget.wait(source)) > 0:
            return self._shed(budget, source, wait)
        try:
            delivery = await self._admit_and_apply(request)
        except StoreUnavailableError as down:
            # Not a fault of the delivery: the sender may try again (nothing was written).
            _log.error(
                "delivery not applied: the event store is unavailable task=- outcome=error "
                "status=503",
                extra={"task": None, "outcome": "error", "status": 503, "reason": str(down)},
            )
            delivery = Delivery(503, "error", _STORE_DOWN)
            detail = delivery.detail
        except CorruptRecordError as corrupt:
            # The task's record was altered in the store: nothing is applied to it (its cause
            # in the log, no traceback; the answer as for any error of ours).
            _log.error(
                "delivery not applied: the task's record cannot be read task=- outcome=error "
                "status=500",
                extra={"task": None, "outcome": "error", "status": 500, "reason": str(corrupt)},
            )
            delivery = Delivery(500, "error", "internal error")
            detail = delivery.detail
        except Exception:
            _log.exception(
                "delivery failed task=- outcome=error status=500",
                extra={"task": None, "outcome": "error", "status": 500, "reason": "internal error"},
            )
            delivery = Delivery(500, "error", "internal error")
            detail = delivery.detail
        else:
            detail = _scrub(delivery.detail, headers)  # no credential in the answer or the log
            _log_decision(delivery, detail)
        self.answered[delivery.status, delivery.outcome] += 1
        if budget is not None and delivery.status in _CHARGED and budget.charge(source):
            _log_shed(budget, source)  # its budget is spent: news, once a window at most
        return _json({"outcome": delivery.outcome, "detail": detail}, delivery.status)

    def _shed(self, budget: RefusalBudget, source: str, wait: float) -> Response:
        """429 for a source whose budget of refusals is spent: nothing read, nothing written,
        nothing logged (its being shed was, once)."""
        retry = str(max(1, math.ceil(wait)))
        detail = (
            f"deliveries from {source}: {budget.limit} refused within {budget.window:g} s: "
            f"body not read, nothing written; retry after {retry} s"
        )
        self.answered[429, "refused"] += 1
        return _json({"outcome": "refused", "detail": detail}, 429, retry_after=retry)

    async def _admit_and_apply(self, request: Request) -> Delivery:
        refusal = _before_reading(request.headers)
        if refusal is not None:
            return refusal
        if self.in_flight >= self.limits.deliveries:
            detail = (
                f"{self.in_flight} deliveries already in flight, the most this server takes "
                "at once: body not read, nothing written; retry later"
            )
            return Delivery(503, "refused", detail)
        self.in_flight += 1
        try:
            return await self._read_and_apply(request)
        finally:
            self.in_flight -= 1

    async def _read_and_apply(self, request: Request) -> Delivery:
        seconds = self.limits.body_seconds
        try:
            async with asyncio.timeout(seconds):
                body = await read_bounded(request.stream(), MAX_DELIVERY_BYTES)
        except ClientDisconnect:
            return Delivery(400, "refused", "client disconnected mid-body")
        except TimeoutError:
            detail = f"body not received in full within {seconds:g} s: nothing written"
            return Delivery(408, "refused", detail)
        if body is None:
            return Delivery(413, "refused", f"body of more than {MAX_DELIVERY_BYTES} bytes")
        return await self.engine.deliver(body, dict(request.headers.items()))

    def families(self) -> list[Family]:
        """What this app counts, for ``GET /metrics``."""
        answered = [
            ({"status": str(status), "outcome": outcome}, float(count))
            for (status, outcome), count in sorted(self.answered.items())
        ]
        return [
            Family(
                "cardfence_deliveries_total",
                "Push deliveries answered, by HTTP status and outcome.",
                "counter",
                answered,
            ),
            Family.single(
                "cardfence_deliveries_in_flight",
                "Push deliveries being read or applied now.",
                "gauge",
                self.in_flight,
            ),
            Family.single(
                "cardfence_delivery_sources_shed",
                "Sources whose deliveries are answered 429 now (their refusals spent).",
                "gauge",
                0 if self.refusals is None else self.refusals.shed(),
            ),
            Family.single(
                "cardfence_delivery_sources_shed_total",
                "Times a source was shed for its refused deliveries (at most once a minute each).",
                "counter",
                0 if self.refusals is None else self.refusals.shed_total,
            ),
        ]

    async def ready(self, _request: Request) -> Response:
        """``GET /readyz``: 200 while the event store answers a read (within 2 s), else 503.
        Checks asked for while one is in flight share its read: however often the route is
        asked, it holds at most one store worker at a time."""
        if self._readiness is None or self._readiness.done():
            self._readiness = asyncio.ensure_future(self._store_answers())
        if await asyncio.shield(self._readiness):
            return JSONResponse({"status": "ready"})
        return _json({"status": "unavailable", "detail": _STORE_DOWN}, 503)

    async def _store_answers(self) -> bool:
        try:
            async with asyncio.timeout(_READY_SECONDS):
                await self.engine.records.calls.run(self.engine.store.last_position)
        except (StoreUnavailableError, TimeoutError) as down:
            reason = str(down) or f"no answer within {_READY_SECONDS:g} s"
            _log.warning(
                "not ready: the event store is unavailable",
                extra={"event": "NotReady", "status": 503, "reason": reason},
            )
            return False
        return True


def _before_reading(headers: Headers) -> Delivery | None:
    """What can be refused from the headers alone: repeats, size announced, content type."""
    for name in _SINGLE_HEADERS:
        if len(headers.getlist(name)) > 1:
            return Delivery(400, "refused", f"{name} header given more than once")
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            return Delivery(400, "refused", "Content-Length is not a number")
        if int(length) > MAX_DELIVERY_BYTES:
            detail = f"body of {int(length)} bytes is over {MAX_DELIVERY_BYTES}"
            return Delivery(413, "refused", detail)
    try:
        webhook.check_content_type(headers)
    except webhook.Refused as refused:
        return refused.delivery
    return None


def _log_decision(delivery: Delivery, detail: str) -> None:
    """The one line a delivery's decision is logged on, with its ``detail`` already scrubbed."""
    fields = {
        "task": delivery.task,
        "outcome": delivery.outcome,
        "status": delivery.status,
        "reason": detail,
    }
    level = logging.INFO if delivery.status < 400 else logging.WARNING
    _log.log(
        level,
        "delivery task=%s outcome=%s status=%d reason=%r",
        delivery.task or "-", delivery.outcome, delivery.status, detail,
        extra=fields,
    )  # fmt: skip


def _log_shed(budget: RefusalBudget, source: str) -> None:
    reason = (
        f"{budget.limit} deliveries refused within {budget.window:g} s: its deliveries are "
        "answered 429 unread until it has room for one more"
    )
    _log.warning(
        "source shed source=%s reason=%r", source, reason,
        extra={"task": None, "outcome": "shed", "status": 429, "reason": reason,
               "source": source},
    )  # fmt: skip


def _json(answer: dict[str, str], status: int, *, retry_after: str | None = None) -> Response:
    if status == 503:
        retry_after = _RETRY_AFTER
    headers = None if retry_after is None else {"retry-after": retry_after}
    return JSONResponse(answer, status, headers=headers)


def _scrub(text: str, headers: Mapping[str, str]) -> str:
    """``text`` without the token or ``Authorization`` credentials this request presented, in
    any form (:mod:`engine.auth.redaction`: a long secret wherever it appears, a short one where it
    stands alone, the longest first whichever header presented it)."""
    secrets = []
    for name in _SECRET_HEADERS:
        presented = headers.get(name)
        if presented is None:
            continue
        value = presented.strip()
        secrets.append(value)
        if name == "authorization" and " " in value:
            secrets.append(value.partition(" ")[2].strip())  # the credentials without the scheme
    return redaction(tuple(secrets), _REDACTED).text(text)
