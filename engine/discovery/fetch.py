"""An Agent Card on the wire: one bounded, conditional GET (R16, R2).

Every read ends within ``CardLimits.timeout`` and by the deadline in force, and takes a request
slot of the engine's when given one; the body is capped once decoded, while it streams in
(:mod:`engine.http.bodies`); redirects are followed within the origin only, at most
``max_redirects``; plain http goes to loopback only (:func:`url_refusal`). A stored validator is
sent (``If-None-Match`` / ``If-Modified-Since``), so an unchanged card answers 304. What is read
is :class:`CardResponse`; :mod:`.discovery` decides what it means and records it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import httpx

from cardfence.engine.cards.model import Interface
from cardfence.engine.cards.signature_policy import CardSignatures
from cardfence.engine.cards.spoken import JSONRPC, V03
from cardfence.engine.cards.urls import checked_url, origin_of, url_refusal, without_userinfo
from cardfence.engine.errors import CardInvalidError, DiscoveryError
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import ACCEPT_ENCODING, BodyRefused, read_body
from cardfence.engine.http.pool import USER_AGENT, RequestSlots

WELL_KNOWN_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, slots=True)
class CardLimits:
    """Bounds on one card read (CLI: ``--card-timeout``, ``--max-card-bytes``), and what makes a
    card acceptable beyond them: its agent's signature policy (``$CARDFENCE_CARD_SIGNATURES``)."""

    timeout: float = 10.0
    connect_timeout: float = 5.0
    max_bytes: int = 1_048_576
    max_redirects: int = 3
    allow_insecure: bool = False  # plain http to hosts other than loopback
    # Signed cards: the policy per agent origin; None (or an agent not listed) ignores signatures.
    signatures: CardSignatures | None = None


@dataclass(frozen=True, slots=True)
class CardResponse:
    """What the wire said: a body (200) or a confirmation of the stored revision (304)."""

    url: str
    status: int
    body: bytes = b""
    etag: str | None = None
    last_modified: str | None = None
    location: str | None = None  # redirects only


# Where an agent's credentials go instead of its URL (docs/cli.md, "The credentials file").
CREDENTIALS_INSTEAD = (
    "give them in the credentials file instead (--credentials FILE or $CARDFENCE_CREDENTIALS; "
    "from Python, EngineConfig.credentials)"
)


def card_urls(agent_url: str) -> tuple[str, tuple[str, ...]]:
    """The agent's origin and the card URLs to try, in order (docs/cli.md: ``AGENT_URL``).

    Every agent URL passes here first, so this is where one the user gave is refused
    (:class:`UsageError`, nothing read or sent): not ``http(s)`` with a host, a port outside
    1-65535, credentials in it (they would be sent as Basic and recorded with the URL: R15 has
    them in the credentials file), a fragment."""
    url = checked_url(agent_url, "agent URL", instead=CREDENTIALS_INSTEAD)
    origin = origin_of(url)
    if url.path.endswith(".json"):
        return origin, (str(url.copy_with(query=None, fragment=None)),)
    base = str(url.copy_with(query=None, fragment=None)).rstrip("/")
    return origin, tuple(base + path for path in WELL_KNOWN_PATHS)


def extended_card_url(interface: Interface) -> str:
    """Where ``GetExtendedAgentCard`` is asked on ``interface``: the JSON-RPC endpoint itself,
    or ``{url}/extendedAgentCard`` over HTTP+JSON (0.3: ``{url}/v1/card``)."""
    if interface.binding == JSONRPC:
        return interface.url
    path = "/v1/card" if interface.dialect == V03 else "/extendedAgentCard"
    return interface.url.rstrip("/") + path


async def fetch_card(
    client: httpx.AsyncClient,
    urls: Sequence[str],
    *,
    validators: Mapping[str, tuple[str | None, str | None]] | None = None,
    limits: CardLimits = CardLimits(),
    slots: RequestSlots | None = None,
) -> CardResponse:
    """GET the card from the first of ``urls`` that is not a 404, within ``limits``.

    ``validators`` maps a URL to its stored ``(etag, last_modified)``, sent as a conditional
    request. ``slots``, when given, is held for the read (the engine's bound on requests in
    flight), waited for within the same time budget. Raises :class:`DiscoveryError` (kinds:
    network, timeout, http_status, redirect, insecure) or :class:`CardInvalidError` (kinds:
    too_large, invalid_card: a content encoding refused).
    """
    last_url = urls[0]
    budget = deadline.left(limits.timeout)  # R16: by the deadline in force, too
    if budget <= 0:
        raise DiscoveryError(last_url, "timeout", "the deadline passed before the card was read")
    try:
        async with asyncio.timeout(budget), slots.held(last_url) if slots else nullcontext():
            for index, url in enumerate(urls):
                last_url = url
                etag, modified = (validators or {}).get(url, (None, None))
                response = await _get_following(client, url, etag, modified, limits)
                if response.status == 404 and index + 1 < len(urls):
                    continue  # 0.2/0.3 agents publish at /.well-known/agent.json
                if response.status in (200, 304):
                    # Recorded under the URL asked for: its validators are kept for that URL.
                    return dataclasses.replace(response, url=url)
                raise DiscoveryError(response.url, "http_status", str(response.status))
    except TimeoutError:
        raise DiscoveryError(
            last_url, "timeout", f"no complete answer within {budget:.3g}s"
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover


async def _get_following(
    client: httpx.AsyncClient,
    url: str,
    etag: str | None,
    modified: str | None,
    limits: CardLimits,
) -> CardResponse:
    current = httpx.URL(url)
    for _ in range(limits.max_redirects + 1):
        refusal = url_refusal(str(current), allow_insecure=limits.allow_insecure)
        if refusal is not None:  # a redirect's credentials are neither sent nor recorded
            raise DiscoveryError(without_userinfo(str(current)), "insecure", refusal)
        headers = {
            "Accept": "application/json",
            "Accept-Encoding": ACCEPT_ENCODING,  # what engine.bodies decodes
            "User-Agent": USER_AGENT,
        }
        if etag:
            headers["If-None-Match"] = etag
        if modified:
            headers["If-Modified-Since"] = modified
        response = await _get_bounded(client, current, headers, limits)
        if response.status not in _REDIRECTS:
            return response
        target = current.join(response.location or "")
        if not response.location or origin_of(target) != origin_of(current):
            shown = without_userinfo(str(target))
            raise DiscoveryError(
                str(current), "redirect", f"redirect to {shown} refused (another origin)"
            )
        current = target
    raise DiscoveryError(url, "redirect", f"more than {limits.max_redirects} redirects")


async def _get_bounded(
    client: httpx.AsyncClient, url: httpx.URL, headers: dict[str, str], limits: CardLimits
) -> CardResponse:
    budget = max(deadline.left(limits.timeout), 0.001)  # fetch_card's total bound holds too
    timeout = httpx.Timeout(budget, connect=min(budget, limits.connect_timeout))
    try:
        async with client.stream(
            "GET", url, headers=headers, timeout=timeout, follow_redirects=False
        ) as response:
            if response.status_code in _REDIRECTS:
                await _drain(response)
                return CardResponse(
                    str(url), response.status_code, location=response.headers.get("location")
                )
            etag = response.headers.get("etag")
            modified = response.headers.get("last-modified")
            if response.status_code != 200:
                await _drain(response)
                return CardResponse(str(url), response.status_code, b"", etag, modified)
            try:
                body = await read_body(response, limits.max_bytes)  # capped once decoded (R16)
            except BodyRefused as refused:
                kind = "too_large" if refused.kind == "too_large" else "invalid_card"
                raise CardInvalidError(str(url), f"card {refused.detail}", kind=kind) from None
            return CardResponse(str(url), 200, body, etag, modified)
    except httpx.TimeoutException as exc:
        raise DiscoveryError(str(url), "timeout", f"timed out ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        detail = str(exc) or type(exc).__name__
        raise DiscoveryError(str(url), "network", f"network error: {detail}") from None


async def _drain(response: httpx.Response, limit: int = 64 * 1024) -> None:
    """Read a small unwanted body so the connection goes back to the pool (a 304 or a 503 page);
    a larger one is left unread and the connection is dropped instead."""
    seen = 0
    try:
        async for chunk in response.aiter_raw():
            seen += len(chunk)
            if seen > limit:
                return
    except httpx.StreamError:
        return  # already read (or closed): nothing left to drain
