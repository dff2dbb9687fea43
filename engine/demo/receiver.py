"""A webhook for push deliveries on 127.0.0.1, in its own thread: each POST to ``/webhook`` is
recorded and, once :meth:`WebhookReceiver.forward_to` was called, handed to
:meth:`Engine.deliver` on the engine's event loop; the engine's answer is the HTTP answer."""

from __future__ import annotations

import asyncio
from typing import Self

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cardfence.engine.client.engine import Engine
from cardfence.engine.demo.server import ServerThread
from cardfence.engine.wire.push import Delivery

__all__ = ["WebhookReceiver"]


class WebhookReceiver:
    """Use as ``with WebhookReceiver() as hook:``; give ``hook.url`` to ``register_webhook``.

    ``deliveries`` holds every POST as (body, headers); ``answers`` the engine's answer to each
    forwarded one. Before :meth:`forward_to`, deliveries are answered 200 and applied nowhere.
    """

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        self.answers: list[Delivery] = []
        self._target: tuple[Engine, asyncio.AbstractEventLoop] | None = None
        app = Starlette(routes=[Route("/webhook", self._endpoint, methods=["POST"])])
        self._server = ServerThread(app)
        self.url = self._server.base_url + "/webhook"

    def forward_to(self, engine: Engine) -> None:
        """From now on, apply deliveries through ``engine`` (call from the engine's loop)."""
        self._target = (engine, asyncio.get_running_loop())

    def stop_forwarding(self) -> None:
        self._target = None

    async def _endpoint(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        self.deliveries.append((body, headers))
        target = self._target
        if target is None:
            return Response(status_code=200)
        engine, loop = target
        future = asyncio.run_coroutine_threadsafe(engine.deliver(body, headers), loop)
        delivery = await asyncio.wrap_future(future)
        self.answers.append(delivery)
        return JSONResponse({"outcome": delivery.outcome}, status_code=delivery.status)

    def start(self) -> Self:
        self._server.start()
        return self

    def stop(self) -> None:
        self._target = None
        self._server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
