"""Where cardfence may speak: the one rule for card, interface and webhook URLs (R16). Pure: it
parses URLs and does no I/O.

:func:`url_refusal` is the rule for a remote URL: a URL that parses, with a port in 1-65535 and no
credentials in it (:func:`url_fault`); plain ``http`` only to loopback (:func:`is_loopback`),
else ``https``. :func:`checked_url` is the same rule for a URL the user gives, as a usage error;
:func:`without_userinfo` is a URL as it may be shown or recorded; :func:`origin_of` the origin an
agent is known by.
"""

from __future__ import annotations

import ipaddress
from typing import Final
from urllib.parse import urlsplit

import httpx

from cardfence.engine.errors import UsageError

__all__ = [
    "checked_url",
    "is_loopback",
    "origin_of",
    "url_fault",
    "url_refusal",
    "without_userinfo",
]


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


def origin_of(url: str | httpx.URL) -> str:
    """``scheme://host[:port]``, lower-case, the default port left out: the key an agent is known
    by (its cards, its credentials, its card signature policy).

    Raises ``ValueError`` when ``url`` is not an http(s) URL with a host.
    """
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    except httpx.InvalidURL as error:
        raise ValueError(f"{url!r} is not a URL") from error
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r} is not an http(s) URL")
    default = {"http": 80, "https": 443}[parsed.scheme]
    port = parsed.port or default
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return f"{parsed.scheme}://{host}" + ("" if port == default else f":{port}")
