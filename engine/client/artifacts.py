"""The engine's part that gives a task's artifacts as typed values, and fetches the files they
name by URL (R15, R16).

An artifact is read from the task's projection: its parts as :mod:`engine.core.parts` types
(:func:`~cardfence.engine.core.parts.from_recorded`), or none when it was kept only as its size
and SHA-256 (``truncated``). A file part given by URL is fetched only when asked, by one bounded
GET (R16: within the request timeout and the deadline in force, a request slot held, the body
capped at the transport's bound on an answer once decoded, no redirect followed): at the task's
own origin, with the credentials its frozen contract grants there (R15); at another origin only
when the caller allows it, and then without any credentials; never at a link-local address (a
cloud's metadata service).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx

from cardfence.engine.auth.credentials import RequestAuth
from cardfence.engine.cards.urls import origin_of, url_refusal, without_userinfo
from cardfence.engine.client._access import Access
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._records import TaskRecords
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.core.parts import Data, File, Part, Text, from_recorded
from cardfence.engine.core.replay import State
from cardfence.engine.errors import (
    EndpointUnreachableError,
    FetchRefusedError,
    InvalidAgentResponseError,
)
from cardfence.engine.http import deadline
from cardfence.engine.http.bodies import ACCEPT_ENCODING, BodyRefused, read_body
from cardfence.engine.http.pool import USER_AGENT
from cardfence.engine.wire.exchange import DEFAULT_MAX_BYTES, hiding, with_auth

__all__ = ["MAX_FETCH_BYTES", "Artifacts", "TaskArtifact", "content_of"]

# A file fetched by its URL is bounded as an agent's answer is (the transport's bound).
MAX_FETCH_BYTES: Final = DEFAULT_MAX_BYTES
_REFUSED_AUTH: Final = frozenset({401, 403})
# Where clouds serve instance metadata (and credentials) outside the link-local ranges: AWS's
# IPv6 endpoint, Alibaba Cloud's.
_METADATA: Final = frozenset(
    {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
)


@dataclass(frozen=True, slots=True)
class TaskArtifact:
    """One artifact of a task as recorded. ``truncated``: kept only as its ``size`` and
    ``sha256`` (of its recorded JSON), so ``parts`` is empty; ``unread``: parts recorded whose
    content cannot be read back (left out of ``parts``); ``partial``: sent in chunks whose
    first ones never reached the engine (a stream joined late), so ``parts`` lacks them."""

    artifact_id: str
    name: str | None
    parts: tuple[Part, ...]
    truncated: bool = False
    size: int | None = None
    sha256: str | None = None
    unread: int = 0
    partial: bool = False

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> TaskArtifact:
        """The artifact a projection's record holds."""
        read = [from_recorded(part) for part in record.get("parts") or ()]
        parts = tuple(part for part in read if part is not None)
        size = record.get("bytes")
        return cls(
            artifact_id=str(record["artifact_id"]),
            name=record.get("name"),
            parts=parts,
            truncated=bool(record.get("truncated")),
            size=size if isinstance(size, int) else None,
            sha256=record.get("sha256"),
            unread=len(read) - len(parts),
            partial=bool(record.get("partial")),
        )


def content_of(part: Part) -> bytes | None:
    """A part's content as a file holds it: a text's UTF-8, a data part's JSON (indented, keys
    in order), a file's bytes; None for a file given by URL (its content is not recorded)."""
    if isinstance(part, Text):
        return part.text.encode("utf-8")
    if isinstance(part, Data):
        return (json.dumps(part.data, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    return part.data


class Artifacts:
    """A task's artifacts, and the files they name by URL fetched."""

    def __init__(
        self,
        config: EngineConfig,
        records: TaskRecords,
        access: Access,
        connections: Connections,
    ) -> None:
        self.config = config
        self.records = records
        self.access = access
        self.connections = connections

    async def of(self, ref: str) -> list[TaskArtifact]:
        """The artifacts of the task ``ref`` names, in the order they were first received."""
        state = await self.records.state(await self.records.find(ref))
        view = await self.records.view(state)  # their content read back (R17)
        return [TaskArtifact.of(record) for record in view.artifacts]

    async def fetch(
        self, ref: str, files: Sequence[File], *, any_origin: bool = False
    ) -> list[bytes]:
        """The content of each file part given by URL, in order, each read by one bounded GET
        (module docstring). Every URL is checked before any is sent.

        :class:`FetchRefusedError`, nothing sent: a part holds bytes, not a URL; a URL is not
        one cardfence may read (R16); it is at another origin than the task's and
        ``any_origin`` is not set; its host is, or resolves to, a link-local address.
        :class:`EndpointUnreachableError` when one cannot be read (network, timeout, an HTTP
        status other than 200), :class:`InvalidAgentResponseError` when its body is over
        :data:`MAX_FETCH_BYTES` or its encoding refused."""
        state = await self.records.state(await self.records.find(ref))
        task_origin = str(state.get("agent") or origin_of(str(state["agent_url"])))
        urls = [await self._checked(part, task_origin, any_origin) for part in files]
        return [await self._fetched(state, url, origin_of(url) == task_origin) for url in urls]

    async def _checked(self, part: File, task_origin: str, any_origin: bool) -> str:
        if part.url is None:
            raise FetchRefusedError(part.filename or "", "the file part holds bytes, not a URL")
        url = part.url
        refusal = url_refusal(url, allow_insecure=self.connections.allow_insecure)
        if refusal is not None:
            raise FetchRefusedError(without_userinfo(url), refusal)
        if origin_of(url) != task_origin and not any_origin:
            raise FetchRefusedError(
                url, f"at another origin than the task's ({task_origin}); --fetch-any "
                "(any_origin=True) fetches it, without the task's credentials",
            )  # fmt: skip
        await _refuse_link_local(url)
        return url

    async def _fetched(self, state: State, url: str, own: bool) -> bytes:
        """One file: with the task's credentials at its own origin only (R15)."""
        credentials = await self.access.task_credentials(state, at=url) if own else None
        cert = credentials.client_cert() if credentials is not None else None
        client = self.connections.client_for(cert)
        auth = await credentials.prepare() if credentials is not None else None
        status, body = await self._get(client, url, auth)
        if status in _REFUSED_AUTH and credentials is not None and credentials.refreshable:
            status, body = await self._get(client, url, await credentials.prepare(refresh=True))
        if status != 200 or body is None:
            raise EndpointUnreachableError(url, f"HTTP {status}: not fetched", status=status)
        return body

    async def _get(
        self, client: httpx.AsyncClient, url: str, auth: RequestAuth | None
    ) -> tuple[int, bytes | None]:
        """One GET: its status, and its body when 200 (bounded)."""
        base = httpx.Headers({"User-Agent": USER_AGENT, "Accept-Encoding": ACCEPT_ENCODING})
        headers, query = with_auth(base, None, auth)
        hide = hiding(auth)
        budget = deadline.left(self.config.request_timeout)
        if budget <= 0:
            raise EndpointUnreachableError(url, "timeout: the deadline passed (not sent)")
        try:
            async with (
                asyncio.timeout(budget),  # total: a slow drip cannot stall us
                self.connections.request_slots.held(url),
                client.stream(
                    "GET", url, params=query, headers=headers,
                    timeout=httpx.Timeout(budget, connect=min(budget, 10.0)),
                    follow_redirects=False,  # a redirect could carry credentials elsewhere
                ) as response,
            ):  # fmt: skip
                if response.status_code != 200:
                    return response.status_code, None
                try:
                    return 200, await read_body(response, MAX_FETCH_BYTES)
                except BodyRefused as refused:
                    raise InvalidAgentResponseError(url, refused.detail) from None
        except (TimeoutError, httpx.TimeoutException):
            detail = f"timeout: no complete answer within {budget:.3g}s"
            raise EndpointUnreachableError(url, detail) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            detail = hide.text(f"network error: {str(exc) or type(exc).__name__}")
            raise EndpointUnreachableError(url, detail) from None


def _link_local(address: str) -> bool:
    """Whether ``address`` is link-local or a cloud's metadata address (IPv4 mapped in IPv6
    too); False for anything that is not an address."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip in _METADATA


async def _refuse_link_local(url: str) -> None:
    """:class:`FetchRefusedError` when the URL's host is, or resolves to, a link-local address
    (169.254.0.0/16, fe80::/10: where clouds serve instance metadata and credentials) or
    another metadata address. A name that does not resolve is left to the request, which fails
    on its own."""
    parsed = httpx.URL(url)
    host = parsed.host
    if _link_local(host):
        raise FetchRefusedError(url, "its host is a link-local address")
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, parsed.port or (443 if parsed.scheme == "https" else 80),
            type=socket.SOCK_STREAM,
        )  # fmt: skip
    except OSError:
        return
    if any(_link_local(str(address[4][0])) for address in found):
        raise FetchRefusedError(url, "its host resolves to a link-local address")
