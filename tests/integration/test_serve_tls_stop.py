"""A stop over HTTPS (engine.serve's uvicorn server): connections closed at the stop are not
left waiting for a client's TLS close, and no answer already written is cut short, against a
real TLS client on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import uvicorn
from support import make_tls

from cardfence.engine.serve.host import Server, listen

BODY = 4 * 1024 * 1024
SMALL = 8192  # socket buffers on both sides: what is not read waits in the server's transports


async def _big(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", b"%d" % BODY)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"x" * BODY})


def _slow_fetch(port: int, ca: Path, held: int) -> int:
    """GET /; then nothing read for 0.5 s (the stop starts), the answer read but its last
    ``held`` bytes, a pause of a second with what the client's socket cannot hold still in the
    server's transports, and the rest. Returns the body's length as received."""
    context = ssl.create_default_context(cafile=str(ca))
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
    raw.connect(("127.0.0.1", port))
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        time.sleep(0.5)
        data, paused = b"", False
        while True:
            try:
                piece = tls.recv(1 << 16 if paused else 4096)
            except (ssl.SSLError, OSError):
                break
            if not piece:
                break
            data += piece
            if not paused and len(data) >= BODY - held:
                paused = True
                time.sleep(1.0)
    return len(data.partition(b"\r\n\r\n")[2])


async def test_a_stop_over_https_sends_every_answer_already_written_in_full(
    tmp_path: Path,
) -> None:
    """The clients pause with 16 to 112 KiB unread: for some of them the TLS layer has handed
    its last bytes to the TCP transport, which still holds some (the kernel's buffers are full).
    An abort judged by the TLS layer alone dropped those."""
    tls = make_tls(tmp_path)
    sock = listen("127.0.0.1", 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)  # accepted sockets inherit it
    config = uvicorn.Config(
        _big,
        log_config=None,
        access_log=False,
        lifespan="off",
        ssl_certfile=str(tls.server_cert),
        ssl_keyfile=str(tls.server_key),
        timeout_graceful_shutdown=30,
    )
    server = Server(config, lambda _name: None)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.02)
    port = sock.getsockname()[1]
    held = range(16 * 1024, 113 * 1024, 8 * 1024)
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(len(held)) as clients:  # all at once
        fetches = [loop.run_in_executor(clients, _slow_fetch, port, tls.ca, n) for n in held]
        received = asyncio.gather(*fetches)
        await asyncio.sleep(0.3)  # every answer written, most of each in the server's buffers
        server.should_exit = True
        assert await received == [BODY] * len(held)
    await serving
