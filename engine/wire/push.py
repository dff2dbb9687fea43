"""Push deliveries: size, content type, JSON shape and credentials checked before anything is
applied (R12). Pure: the engine calls these, then applies the observation like any other.

Secrets are never stored: a webhook's token (and ``Authorization`` credentials, when configured)
are kept as SHA-256 digests and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cardfence.engine.cards.canonical import loads
from cardfence.engine.cards.fields import FieldError
from cardfence.engine.core.answers import StreamUpdate
from cardfence.engine.errors import InvalidAgentResponseError
from cardfence.engine.wire import _v03 as wire03
from cardfence.engine.wire.v10 import parse_stream_response

MAX_DELIVERY_BYTES = 256 * 1024
TOKEN_HEADER = "x-a2a-notification-token"
MAX_DELIVERIES_IN_FLIGHT = 256  # IngressLimits.deliveries, by default
BODY_SECONDS = 10.0  # IngressLimits.body_seconds, by default
MAX_REFUSALS = 256  # IngressLimits.refusals, by default: refused deliveries per source a minute


@dataclass(frozen=True, slots=True)
class IngressLimits:
    """What one webhook app takes at once.

    ``deliveries``: deliveries in flight at most, from the first byte of the body read to the
    answer; one more is answered 503 (``Retry-After: 1``) without its body being read, so the
    bodies held at once are at most ``deliveries`` x 256 KiB. ``body_seconds``: the time a body
    may take to arrive in full; a slower one is answered 408. ``refusals``: deliveries from one
    source (client address) refused at most in a burst, given back at as many a minute
    (:mod:`cardfence.engine.serve._shedding`); a source past it is answered 429 with
    ``Retry-After``,
    unread, until it has room for one more (None: no such limit). Every refusal writes
    nothing."""

    deliveries: int = MAX_DELIVERIES_IN_FLIGHT
    body_seconds: float = BODY_SECONDS
    refusals: int | None = MAX_REFUSALS

    def __post_init__(self) -> None:
        if self.deliveries < 1:
            raise ValueError("IngressLimits.deliveries must be at least 1")
        if not self.body_seconds > 0:
            raise ValueError("IngressLimits.body_seconds must be more than 0")
        if self.refusals is not None and self.refusals < 1:
            raise ValueError("IngressLimits.refusals must be at least 1 (None: no limit)")


@dataclass(frozen=True, slots=True)
class Delivery:
    """How a delivery was answered: the HTTP status, an outcome word, and why."""

    status: int
    outcome: str  # applied, duplicate, ignored, stale, refused
    detail: str = ""
    task: str | None = None


class Refused(Exception):
    """A delivery refused, with nothing written."""

    def __init__(self, status: int, detail: str, task: str | None = None) -> None:
        super().__init__(detail)
        self.delivery = Delivery(status, "refused", detail, task)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _matches(presented: str | None, expected_digest: str | None) -> bool:
    if presented is None or expected_digest is None:
        return False
    return hmac.compare_digest(digest(presented), expected_digest)


def decode(body: bytes, headers: Mapping[str, str]) -> StreamUpdate:
    """The delivery's StreamResponse, or :class:`Refused` (413, 415, 400). A 1.0 agent pushes a
    StreamResponse (``{"task"}``, ``{"statusUpdate"}``, …), a 0.3 agent the whole Task: told
    apart by shape (:func:`engine.wire._v03.push_body`), both are read the same way."""
    if len(body) > MAX_DELIVERY_BYTES:
        raise Refused(413, f"body of {len(body)} bytes is over {MAX_DELIVERY_BYTES}")
    check_content_type(headers)
    try:
        document: Any = loads(body)  # I-JSON (R16): a repeated member is refused, not guessed at
    except FieldError as exc:
        raise Refused(400, str(exc)[:200]) from None
    try:
        return parse_stream_response(wire03.push_body(document), url="webhook")
    except InvalidAgentResponseError as exc:
        raise Refused(400, f"not an A2A StreamResponse: {exc}") from None


def check_content_type(headers: Mapping[str, str]) -> None:
    """Raise :class:`Refused` (415) unless the delivery's content type is JSON
    (``application/json`` or any ``+json`` type); the body need not have been read."""
    content_type = _header(headers, "content-type") or ""
    essence = content_type.split(";", 1)[0].strip().lower()
    if essence != "application/json" and not essence.endswith("+json"):
        raise Refused(415, f"content type {content_type or 'none'!r} is not JSON")


def authenticates(webhook: Mapping[str, Any] | None, headers: Mapping[str, str]) -> bool:
    """Whether the delivery's token (and Authorization, when configured) are those of this
    registered webhook configuration."""
    if webhook is None or not _matches(_header(headers, TOKEN_HEADER), webhook.get("token_sha256")):
        return False
    expected_auth = webhook.get("auth_sha256")
    return expected_auth is None or _matches(_header(headers, "authorization"), expected_auth)


def match_task(
    remote_task_id: str,
    candidates: Sequence[tuple[str, Mapping[str, Any] | None]],
    headers: Mapping[str, str],
) -> str:
    """The key of the task a delivery is for: among the tasks with its remote task id
    (``(key, webhook)`` pairs, one per agent at most), the one whose webhook configuration the
    delivery authenticates as (R16: never the remote task id alone). :class:`Refused` 404 when
    no task with that id has a webhook, 401 when none authenticates, 409 when several do."""
    registered = [(key, hook) for key, hook in candidates if hook is not None]
    if not registered:
        if not candidates:
            raise Refused(404, f"no task with remote id {remote_task_id!r}")
        raise Refused(404, f"no task with remote id {remote_task_id!r} has a webhook registered")
    matched = [key for key, hook in registered if authenticates(hook, headers)]
    if len(matched) == 1:
        return matched[0]
    if not matched:
        check_credentials(registered[0][1] or {}, headers)  # says which credential is wrong
        raise Refused(401, "missing or wrong X-A2A-Notification-Token")
    raise Refused(409, f"{len(matched)} tasks with remote id {remote_task_id!r} share these "
                       "credentials: register each webhook with its own token")  # fmt: skip


def check_credentials(webhook: Mapping[str, Any], headers: Mapping[str, str]) -> None:
    """Raise :class:`Refused` (401) unless the token (and Authorization, when configured) match
    the webhook registered for the task."""
    if not _matches(_header(headers, TOKEN_HEADER), webhook.get("token_sha256")):
        raise Refused(401, "missing or wrong X-A2A-Notification-Token")
    expected_auth = webhook.get("auth_sha256")
    if expected_auth is not None and not _matches(_header(headers, "authorization"), expected_auth):
        raise Refused(401, "missing or wrong Authorization")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None
