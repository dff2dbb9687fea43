"""One ``POST /webhook`` straight through an ASGI app's interface, whatever its head says (no
HTTP client sends a repeated Content-Type or a Content-Length that is not a number) and however
its body arrives (``receive``): for the webhook app's unit tests, which need no server."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.types import ASGIApp, Message

CLIENT = ("127.0.0.1", 40000)


async def post_webhook(
    app: ASGIApp,
    headers: Iterable[tuple[bytes, bytes]],
    receive: Callable[[], Awaitable[Message]],
    *,
    client: tuple[str, int] | None = CLIENT,
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """The status, headers and JSON ``app`` answers a ``POST /webhook`` from ``client``."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/webhook",
        "raw_path": b"/webhook",
        "root_path": "",
        "query_string": b"",
        "headers": list(headers),
        "client": client,
        "server": ("127.0.0.1", 8080),
    }
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    head = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], head, json.loads(body)
