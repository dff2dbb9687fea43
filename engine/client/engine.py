"""The Engine: start, follow, reply to, cancel and resume A2A tasks, recording everything.

Card state may gate task creation (:meth:`Engine.start_task`, R2, R3) and webhook registration
(:meth:`Engine.register_webhook`, R4). It never gates continuation: every remote report goes
through :func:`engine.core.observations.apply_observation`, which takes no card. Card re-checks (R6)
and re-validation (R7, R8) run beside the polling, and only ever add diagnostics, flags or a switch
to polling.

The Engine is a facade over parts it holds, each a plain class given the parts it uses when it
is made (none knows the Engine): ``records`` (the task log), ``background`` (work beside the
tasks), ``access`` (credentials, R15), ``connections`` (transports and card reads), ``asking``
(waits an agent asked for, R5), ``observing`` (the one observation path and the push ingress),
``creation`` (what card state may gate), ``following`` (polls, drives, streams), ``resumption``
(resume), ``conversation`` (reply and cancel), ``outputs`` (a task's artifacts, and the files
they name by URL) and ``feed`` (the task updates read from the log, and the waits on them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any, Self

import httpx

from cardfence.engine.client._access import Access
from cardfence.engine.client._asking import Asking
from cardfence.engine.client._background import Background
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._conversation import Conversation
from cardfence.engine.client._observing import Observing
from cardfence.engine.client._records import TaskRecords
from cardfence.engine.client._resumption import Resumption
from cardfence.engine.client.artifacts import Artifacts, TaskArtifact
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.creation import Creation, WebhookOutcome
from cardfence.engine.client.following import Following, Pace
from cardfence.engine.client.tasklog import AsOf
from cardfence.engine.client.updates import TaskUpdate, UpdateFeed
from cardfence.engine.core.parts import File, Part
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.http.offload import StoreCalls
from cardfence.engine.http.pool import RequestSlots, engine_client, tls_context
from cardfence.engine.wire import push as webhook
from cardfence.store.event_store import EventStore

__all__ = ["Engine"]


class Engine:
    """An asyncio engine over an event store: ``async with Engine.connect(url) as engine``."""

    def __init__(
        self,
        store: EventStore,
        client: httpx.AsyncClient,
        config: EngineConfig = EngineConfig(),
        *,
        owns_client: bool = False,
        clock: Callable[[], float] = time.monotonic,
        calls: StoreCalls | None = None,
    ) -> None:
        """``calls``: how store calls leave the event loop (:class:`StoreCalls`; by default
        worker threads as many as the store's dialect suits)."""
        self.store = store
        self.client = client
        self.config = config
        self.clock = clock
        slots = RequestSlots(config.requests_in_flight, config.requests_per_agent)
        calls = calls or StoreCalls(store)
        self.discovery = Discovery(
            store, client, limits=config.card_limits, max_card_age=config.max_card_age,
            clock=clock, calls=calls, slots=slots,
        )  # fmt: skip
        # The parts, each made with the parts it uses: none knows the Engine.
        self.records = TaskRecords(store, calls)
        self.background = Background()
        self.access = Access(config, self.records)
        self.connections = Connections(
            config, client, self.discovery, self.access, owns_client=owns_client, slots=slots
        )
        self.asking = Asking(config, self.records)
        self.observing = Observing(
            config, self.records, self.connections, self.background, self.asking
        )
        self.creation = Creation(
            config, self.discovery, self.records, self.connections, self.access, self.asking,
            self.observing,
        )  # fmt: skip
        self.following = Following(
            config, self.records, self.connections, self.background, self.asking,
            self.observing, clock=clock,
        )  # fmt: skip
        self.resumption = Resumption(
            self.discovery, self.records, self.connections, self.access, self.creation,
            self.following,
        )  # fmt: skip
        self.conversation = Conversation(
            self.records, self.connections, self.asking, self.observing,
            self.config.max_message_bytes,
        )  # fmt: skip
        self.outputs = Artifacts(config, self.records, self.access, self.connections)
        self.feed = UpdateFeed(self.records)
        self.log = self.records.log
        self.tokens = self.access.tokens
        self.authorizer = self.access.authorizer

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        config: EngineConfig = EngineConfig(),
    ) -> AsyncIterator[Self]:
        """``async with Engine.connect(url) as engine``: an engine on the store at ``url``
        (migrated to head), with its own client if none is given; closed when the block ends.
        Connecting and migrating run off the event loop, like every other store call (on
        PostgreSQL they are network round trips; on SQLite another process may hold the lock)."""
        store = await asyncio.to_thread(EventStore.open, url)
        try:
            own = client is None
            if client is None:
                # Loading the trust store reads files: off the loop as well.
                client = engine_client(await asyncio.to_thread(tls_context, config.ca_file))
            engine = cls(store, client, config, owns_client=own)
        except BaseException:
            store.close()
            raise
        async with engine:
            yield engine

    async def aclose(self) -> None:
        # Background jobs first (closing reads let finish, within the request timeout), before
        # the clients and the store they need are closed.
        await self.background.stop(self.config.request_timeout)
        await self.connections.aclose()
        await self.access.aclose()
        # Off the loop: the appends in flight finish first, and closing PostgreSQL's
        # connections is a round trip each.
        await asyncio.to_thread(self._close_store)

    def _close_store(self) -> None:
        self.records.calls.close()
        self.store.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    @property
    def background_errors(self) -> list[Exception]:
        """What background checks failed with (each logged; the first hundred kept)."""
        return self.background.errors

    async def settle(self) -> None:
        """Wait for background re-checks, re-validations and closing reads; raise the first error
        one of them hit (tests, shutdown). Closing reads included."""
        await self.background.settle()

    # -- reading -------------------------------------------------------------------------------

    async def task(self, ref: str, *, as_of: AsOf | None = None) -> TaskView:
        """The task ``ref`` names (key, remote id, or a prefix of either); with ``as_of``, as
        it stood at that point of the log, by replaying its events up to there."""
        return await self.records.calls.run(self.records.task, ref, as_of=as_of)

    async def tasks(self, state: str | None = None, *, as_of: AsOf | None = None) -> list[TaskView]:
        """Every task (only those in ``state`` if given); with ``as_of``, as they stood then."""
        return await self.records.calls.run(self.records.tasks, state, as_of=as_of)

    def updates(
        self, ref: str | None = None, *, after: int | None = None
    ) -> AsyncGenerator[TaskUpdate, None]:
        """``async for update in engine.updates()``: each event recorded on the task ``ref``
        names (on every task when ``None``), with the task as it stands after it and its global
        position, read from the log (what another process recorded included); those after
        the position ``after``, or from now on when it is ``None``. Resumed with the last
        position handled, nothing is missed and nothing seen twice
        (:meth:`UpdateFeed.updates`)."""
        return self.feed.updates(ref, after=after)

    async def wait_for(
        self, ref: str, state: str | Collection[str], *, timeout: float | None = None
    ) -> TaskView:
        """The task once it is in ``state`` (or any of several states): at once if it is
        already. A task that ends in another state raises :class:`TaskEndedError`; one not
        there within ``timeout`` seconds :class:`DeadlineExceeded`. Only reads the log: the
        task is moved by whatever drives it (:meth:`drive`, ``cardfence serve``, ``serving``)
        (:meth:`UpdateFeed.wait_for`)."""
        return await self.feed.wait_for(ref, state, timeout=timeout)

    async def artifacts(self, ref: str) -> list[TaskArtifact]:
        """The artifacts of the task ``ref`` names, as recorded: id, name, and parts as the
        part types (none for an artifact kept only as its size and digest, ``truncated``)."""
        return await self.outputs.of(ref)

    async def fetch_files(
        self, ref: str, files: Sequence[File], *, any_origin: bool = False
    ) -> list[bytes]:
        """The content of each file part given by URL of the task ``ref`` names, every URL
        checked before any is sent: one bounded GET each (R16), at the task's own origin with
        its credentials there (R15), at another origin only with ``any_origin`` and then without
        credentials, never at a link-local address (:meth:`Artifacts.fetch`)."""
        return await self.outputs.fetch(ref, files, any_origin=any_origin)

    # -- creation and webhooks (R2, R3, R4) ----------------------------------------------------

    async def start_task(
        self,
        agent_url: str,
        *,
        skill: str | None = None,
        text: str | None = None,
        media_type: str = "text/plain",
        parts: Sequence[Part] = (),
        context: str | None = None,
        references: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        accept: Sequence[str] = (),
        accept_contract: bool = False,
        key: str | None = None,
        extensions: Sequence[str] = (),
    ) -> TaskView:
        """Create a task: fresh card read, skill, media-type, output-mode and extension check,
        contract check, freeze, record, send; nothing is sent on any refusal
        (:meth:`Creation.start_task`). The message is ``text`` (the short form of a first
        ``Text(text, media_type)``) then ``parts``; ``context``, ``references``: earlier tasks
        of this store."""
        return await self.creation.start_task(
            agent_url, skill=skill, text=text, media_type=media_type, parts=parts,
            context=context, references=references, metadata=metadata, accept=accept,
            accept_contract=accept_contract, key=key, extensions=extensions,
        )  # fmt: skip

    async def register_webhook(
        self,
        ref: str,
        url: str,
        *,
        token: str | None = None,
        auth_scheme: str | None = None,
        auth_credentials: str | None = None,
    ) -> WebhookOutcome:
        """Ask for push delivery, gated by a read made for this registration (R4)
        (:meth:`Creation.register_webhook`)."""
        return await self.creation.register_webhook(
            ref, url, token=token, auth_scheme=auth_scheme, auth_credentials=auth_credentials
        )

    # -- push deliveries (R5, R12) -------------------------------------------------------------

    async def deliver(self, body: bytes, headers: Mapping[str, str]) -> webhook.Delivery:
        """Ingest one push delivery: checked (size, type, shape, credentials), then applied like
        any other observation. Refusals write nothing (:meth:`Observing.deliver`)."""
        return await self.observing.deliver(body, headers)

    # -- continuation (R1, R5-R12) -------------------------------------------------------------

    async def poll(self, ref: str) -> TaskView:
        """One continuation step: GetTask on the task's recorded endpoint, applied. No discovery."""
        return await self.following.poll(ref)

    async def drive(
        self, ref: str, *, until: str = "interrupted", timeout: float = 300.0
    ) -> TaskView:
        """Follow the task until ``until`` or the deadline, polling with backoff bounded by
        ``max_poll_interval`` (R5, R16; :meth:`Following.drive`)."""
        return await self.following.drive(ref, until=until, timeout=timeout)

    async def follow_step(self, key: str, state: State, pace: Pace) -> State:
        """One step of following a live task (:meth:`Following.follow_step`)."""
        return await self.following.follow_step(key, state, pace)

    async def stream_offered(self, key: str, state: State | None = None) -> bool:
        """Whether to follow the task's event stream now (:meth:`Following.stream_offered`)."""
        return await self.following.stream_offered(key, state)

    async def follow_stream(self, key: str) -> State:
        """Follow the task's event stream on its recorded endpoint
        (:meth:`Following.follow_stream`)."""
        return await self.following.follow_stream(key)

    async def keep_streaming(
        self,
        key: str,
        *,
        retry_limit: float | None = None,
        after_each: Callable[[], None] | None = None,
    ) -> None:
        """Follow the task's stream while it is offered, subscribing again after a drop
        (:meth:`Following.keep_streaming`)."""
        await self.following.keep_streaming(key, retry_limit=retry_limit, after_each=after_each)

    @property
    def stream_after(self) -> float:
        """How far apart a task's polls are before its stream is followed too
        (:attr:`Following.stream_after`)."""
        return self.following.stream_after

    # -- replies, cancels and resume (R9, R10) -------------------------------------------------

    async def reply(
        self,
        ref: str,
        text: str | None = None,
        *,
        media_type: str = "text/plain",
        parts: Sequence[Part] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> TaskView:
        """Answer an input-required (or auth-required) task with ``text`` and/or ``parts``
        (:meth:`Conversation.reply`); a continuation, never checked against the card (R1)."""
        return await self.conversation.reply(
            ref, text, media_type=media_type, parts=parts, metadata=metadata
        )

    async def cancel(self, ref: str) -> TaskView:
        """Ask the remote to cancel. The state moves only when the remote reports it (R10)."""
        return await self.conversation.cancel(ref)

    async def resume(self, ref: str, *, accept_contract: bool = False) -> TaskView:
        """Reconcile the task with a fresh card before any request to its endpoint (R9), and
        find its remote id if a crash fell between send and record (:meth:`Resumption.resume`).
        Does not drive; call :meth:`drive` next."""
        return await self.resumption.resume(ref, accept_contract=accept_contract)
