"""The webhook ingress: an ASGI app (Starlette) that takes push deliveries over HTTP and hands
each one to :meth:`Engine.deliver`. ``cardfence serve`` runs it under uvicorn; a host application
can mount it (``Mount("/a2a", webhook_app(engine))``).

Routes:

- ``POST /webhook`` (``path``): one delivery. Checked before the body is read: ``Content-Length``
  over :data:`~cardfence.engine.webhook.MAX_DELIVERY_BYTES` (413), a content type other than JSON
  (415), a repeated ``Content-Type``, token or ``Authorization`` header (400). The body is read
  chunk by chunk and refused (413) as soon as it passes the limit, with or without a
  ``Content-Length``: never more than the limit and one chunk is held. The engine then checks its
  shape and credentials (tokens compared as SHA-256 digests, in constant time) and applies it.
  The answer is ``Delivery.status`` with ``{"outcome": ..., "detail": ...}``; the detail never
  carries the token or ``Authorization`` presented. An unexpected error answers 500 with a generic
  detail; the store writes a transition in one transaction, so nothing is half-written. Other
  methods answer 405.
- ``GET /healthz``: ``{"status": "ok"}``, liveness only (it does not touch the store).

Every delivery decision is logged once on the ``cardfence.ingress`` logger, with ``task``,
``outcome``, ``status`` and ``reason`` also as record attributes (for structured handlers); no
secret is ever logged.

The app calls the engine on the event loop that serves it: serve it on the loop the engine was
opened on (``cardfence serve`` does; so does a host that opens the engine in its lifespan).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cardfence.engine import webhook
from cardfence.engine.engine import Engine
from cardfence.engine.webhook import MAX_DELIVERY_BYTES, TOKEN_HEADER, Delivery

__all__ = ["HEALTH_PATH", "read_bounded", "webhook_app"]

HEALTH_PATH = "/healthz"
_SINGLE_HEADERS = ("content-type", TOKEN_HEADER, "authorization")
_SECRET_HEADERS = (TOKEN_HEADER, "authorization")
_REDACTED = "[redacted]"
_log = logging.getLogger("cardfence.ingress")


def webhook_app(engine: Engine, *, path: str = "/webhook") -> Starlette:
    """An ASGI app taking push deliveries for ``engine`` at ``POST path`` (see the module)."""
    if path == HEALTH_PATH:
        raise ValueError(f"the webhook path cannot be {HEALTH_PATH}, the health check's")

    async def deliveries(request: Request) -> Response:
        return await _deliver(engine, request)

    return Starlette(
        routes=[
            Route(path, deliveries, methods=["POST"]),
            Route(HEALTH_PATH, _health, methods=["GET"]),
        ]
    )


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


async def _deliver(engine: Engine, request: Request) -> Response:
    headers = request.headers
    try:
        refusal = _before_reading(headers)
        if refusal is not None:
            return _answer(refusal, headers)
        try:
            body = await read_bounded(request.stream(), MAX_DELIVERY_BYTES)
        except ClientDisconnect:
            return _answer(Delivery(400, "refused", "client disconnected mid-body"), headers)
        if body is None:
            detail = f"body of more than {MAX_DELIVERY_BYTES} bytes"
            return _answer(Delivery(413, "refused", detail), headers)
        delivery = await engine.deliver(body, dict(headers.items()))
    except Exception:
        _log.exception(
            "delivery failed task=- outcome=error status=500",
            extra={"task": None, "outcome": "error", "status": 500, "reason": "internal error"},
        )
        return JSONResponse({"outcome": "error", "detail": "internal error"}, status_code=500)
    return _answer(delivery, headers)


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


def _answer(delivery: Delivery, headers: Mapping[str, str]) -> Response:
    detail = _scrub(delivery.detail, headers)
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
    return JSONResponse({"outcome": delivery.outcome, "detail": detail}, delivery.status)


def _scrub(text: str, headers: Mapping[str, str]) -> str:
    """``text`` without the token or ``Authorization`` credentials this request presented."""
    for name in _SECRET_HEADERS:
        value = (headers.get(name) or "").strip()
        secrets = [value]
        if name == "authorization" and " " in value:
            secrets.append(value.split(" ", 1)[1].strip())  # the credentials without the scheme
        for secret in sorted(secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, _REDACTED)
    return text
