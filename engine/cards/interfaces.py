"""Which of an Agent Card's interfaces cardfence talks to, and in what. Pure: no I/O.

What cardfence speaks: two bindings (``JSONRPC``, ``HTTP+JSON``, which 0.3 also called ``REST``),
two A2A versions (:data:`V10` for any 1.x, :data:`V03` for 0.3 and 0.2: :func:`spoken_version`),
and the media types a skill's modes name (0.3's bare words name the kind of part:
:func:`part_kind`). Where it may speak: :func:`url_refusal`, the one rule for card, interface and
webhook URLs (R16: a URL that parses, with a port in 1-65535 and no credentials in it
(:func:`url_fault`); plain ``http`` only to loopback, else ``https``); :func:`checked_url`, the
same rule for a URL the user gives, as a usage error. :func:`select_interface`
chooses, among a card's interfaces, one that cardfence speaks and may use. The card and its
parsing are :mod:`.model`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

import httpx

from cardfence.engine.errors import CardInvalidError, ProtocolUnsupportedError, UsageError

if TYPE_CHECKING:  # for annotations only: the model imports what is here
    from cardfence.engine.cards.model import AgentCard, Interface

__all__ = [
    "HTTP_JSON",
    "JSONRPC",
    "SPOKEN_BINDINGS",
    "V03",
    "V10",
    "checked_url",
    "dialect_of",
    "is_loopback",
    "part_kind",
    "select_interface",
    "spoken_version",
    "url_fault",
    "url_refusal",
    "without_userinfo",
]

JSONRPC: Final = "JSONRPC"
HTTP_JSON: Final = "HTTP+JSON"
SPOKEN_BINDINGS: Final = (JSONRPC, HTTP_JSON)
# The A2A versions cardfence speaks: 1.0 (any 1.x is sent as 1.0) and 0.3 (0.2 agents use the
# same method names and shapes, docs/wire.md).
V10: Final = "1.0"
V03: Final = "0.3"
# 0.3 also called HTTP+JSON "REST"; names are compared upper-cased.
_BINDING_ALIASES: Final = {"JSONRPC": JSONRPC, "HTTP+JSON": HTTP_JSON, "REST": HTTP_JSON}


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (IPv6 with or without its brackets)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_INVALID: Final = "not a valid URL"
_BAD_PORT: Final = "its port is not a number from 1 to 65535"
_CREDENTIALS: Final = "it carries credentials (user:password@)"


def url_fault(url: str) -> str | None:
    """What makes ``url`` unusable whatever its scheme, or None: it does not parse (as the
    standard library and httpx both read it), its port is not in 1-65535 (the client would fail
    below its own errors), or it carries credentials (``user:password@``: httpx would send them
    as Basic, and every record of the URL would keep them). The reason never repeats the URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return _BAD_PORT if str(error).startswith("Port") else _INVALID
    if port == 0:
        return _BAD_PORT
    if "@" in parts.netloc:
        return _CREDENTIALS
    try:
        httpx.URL(url)
    except httpx.InvalidURL:
        return _INVALID
    return None


def without_userinfo(url: str) -> str:
    """``url`` as it may be shown or recorded: any ``user:password@`` left out of its
    authority (read as :func:`urllib.parse.urlsplit` reads it; the URL need not be valid)."""
    scheme, slashes, rest = url.partition("//")
    if not slashes:
        return url
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    userinfo, at, _ = rest[:end].rpartition("@")
    return f"{scheme}//{rest[len(userinfo) + 1 :]}" if at else url


def checked_url(
    url: str, what: str, *, instead: str = "", consequence: str = "nothing was read or sent"
) -> httpx.URL:
    """A URL the user gives (an agent's, a webhook's), parsed; else :class:`UsageError`: it
    must be ``http`` or ``https`` with a host, a port in 1-65535, no credentials and no
    fragment (which is never sent). The message shows the URL without its credentials;
    ``instead`` says where credentials go, ``consequence`` what was (not) done."""
    fault = url_fault(url)
    if fault == _CREDENTIALS and instead:
        fault = f"{fault}: {instead}"
    if fault is None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            fault = "not an http(s) URL with a host"
        elif parsed.fragment:
            fault = "it has a fragment (#...), which is never sent"
        else:
            return parsed
    raise UsageError(f"{what} {without_userinfo(url)!r}: {fault}; {consequence}")


def url_refusal(url: str, *, allow_insecure: bool = False) -> str | None:
    """Why a remote URL may not be used, or None when it may: the one rule for card, interface
    and webhook URLs (R16): no :func:`url_fault`, and plain ``http`` only to loopback, else
    ``https``. ``allow_insecure`` lifts the loopback condition (CLI: ``--allow-insecure-http``)."""
    fault = url_fault(url)
    if fault is not None:
        return fault
    parts = urlsplit(url)
    host = parts.hostname or ""
    scheme = parts.scheme.lower()
    if scheme == "https" and host:
        return None
    if scheme != "http" or not host:
        return "not an http(s) URL with a host"
    if allow_insecure or is_loopback(host):
        return None
    return "plain http to a non-loopback host refused (https required)"


def select_interface(
    card: AgentCard, prefer: Sequence[str] = (), *, allow_insecure: bool = False
) -> Interface:
    """Choose the endpoint to talk to.

    Among interfaces we speak (JSON-RPC or HTTP+JSON over http(s), A2A 1.x, 0.3 or 0.2:
    :func:`spoken_version`) and may use (:func:`url_refusal`: plain ``http`` only to loopback
    unless ``allow_insecure``), 1.x protocol versions come first (we send ``A2A-Version: 1.0``),
    then an interface that declares none (1.0 is meant), then 0.3 and 0.2; within each, the
    caller's ``prefer`` order of bindings (a preference: unlisted bindings still qualify after
    the listed ones), then the card's order, which is the agent's preference.

    Raises:
        ValueError: ``prefer`` names a binding we do not speak.
        CardInvalidError: no interface is speakable (field ``supportedInterfaces``), or none of
            them may be used (kind ``insecure``).
        ProtocolUnsupportedError: (a :class:`CardInvalidError`, kind ``unsupported_protocol``)
            some interface has a binding we speak, but none an A2A version we speak.
    """
    rank: dict[str, int] = {}
    for name in prefer:
        binding = _BINDING_ALIASES.get(name.upper())
        if binding is None:
            raise ValueError(f"cannot prefer binding {name!r}: we speak {SPOKEN_BINDINGS}")
        rank.setdefault(binding, len(rank))
    bound = [
        (n, i)
        for n, i in enumerate(card.interfaces)
        if i.binding in SPOKEN_BINDINGS and i.url.lower().startswith(("http://", "https://"))
    ]
    speakable = [
        (_version_rank(i), rank.get(i.binding, len(rank)), n, i) for n, i in bound if i.speaks
    ]
    if bound and not speakable:
        versions = tuple(dict.fromkeys(i.protocol_version for _, i in bound))
        raise ProtocolUnsupportedError(card.source_url, versions)
    if not speakable:
        offered = ", ".join(f"{i.binding or '?'} {i.url}" for i in card.interfaces)
        raise CardInvalidError(
            card.source_url,
            f"invalid Agent Card: supportedInterfaces: none we speak ({offered})",
            field="supportedInterfaces",
        )
    refused = [(i, url_refusal(i.url, allow_insecure=allow_insecure)) for *_, i in speakable]
    usable = [entry for entry, (_, why) in zip(speakable, refused, strict=True) if why is None]
    if not usable:
        named = "; ".join(f"{i.binding} {i.url}: {why}" for i, why in refused[:3])
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        raise CardInvalidError(
            card.source_url,
            f"no interface may be used: {named}{more}",
            field="supportedInterfaces",
            kind="insecure",
        )
    return min(usable, key=lambda entry: entry[:3])[3]


# --- media types and versions ---------------------------------------------------------------------


def _modes_match(modes: tuple[str, ...], media_type: str) -> bool:
    """Media ranges ``*/*`` and ``type/*`` match; parameters and case are ignored. The bare
    words of 0.3 cards name the kind of part the agent takes (docs/wire.md): ``text`` is any
    ``text/*`` type (a text part), ``data`` a JSON type (``application/json``, ``*/*+json``: a
    data part), ``file`` any other type (a file part)."""
    if not modes:
        return True
    wanted = _essence(media_type)
    for mode in map(_essence, modes):
        if mode in ("*/*", "*", wanted) or part_kind(wanted) == mode:
            return True
        if mode.endswith("/*") and wanted.partition("/")[0] == mode[:-2] and "/" in wanted:
            return True
    return False


def part_kind(media_type: str) -> str:
    """The 0.3 part a message of this media type travels in: ``text``, ``data`` or ``file`` --
    what the bare words of a 0.3 card's modes name."""
    media_type = _essence(media_type)
    if media_type.startswith("text/"):
        return "text"
    if media_type == "application/json" or media_type.endswith("+json"):
        return "data"
    return "file"


def _essence(media_type: str) -> str:
    return media_type.partition(";")[0].strip().lower()


def dialect_of(declared: str, *, legacy_card: bool = False) -> str:
    """The version whose methods and shapes a request to an interface that declares
    ``declared`` takes: :data:`V03` for any 0.x (and a 0.x card that declares none), else
    :data:`V10`."""
    version = declared.strip()
    return V03 if version.startswith("0.") or (legacy_card and not version) else V10


def spoken_version(declared: str, *, legacy_card: bool = False) -> str:
    """The A2A version cardfence speaks to an interface that declares ``declared``: :data:`V10`
    for 1.x, :data:`V03` for 0.3 and 0.2 (same methods and shapes), ``""`` for any other.
    Nothing declared means 1.0 (it is required there), or 0.3 on a 0.x-shaped card
    (``legacy_card``: 0.2 cards had no ``protocolVersion``)."""
    version = declared.strip()
    if not version:
        return V03 if legacy_card else V10
    major, _, rest = version.partition(".")
    if major == "1":
        return V10
    if major == "0" and rest.partition(".")[0] in ("2", "3"):
        return V03
    return ""


def _version_rank(interface: Interface) -> int:
    """1.x first, then an interface that declares no version (1.0 is meant), then 0.x."""
    if interface.speaks == V10:
        return 0 if interface.protocol_version.strip() else 1
    return 2


def origin_of(url: httpx.URL) -> str:
    """``scheme://host[:port]``, the default port left out: the key an agent is known by."""
    default = {"http": 80, "https": 443}[url.scheme]
    port = url.port or default
    host = f"[{url.host}]" if ":" in url.host else url.host
    return f"{url.scheme}://{host}" + ("" if port == default else f":{port}")
