"""The engine's part that resumes a task (R9): reconciled with a fresh card before any request to
its endpoint, its credentials moved when the caller accepts a new origin (R15), and a send whose
outcome is unknown looked for, or made again through creation's gate (R3).
"""

from __future__ import annotations

from cardfence.engine.auth.config import normalise_origin
from cardfence.engine.client._access import Access
from cardfence.engine.client._connections import Connections
from cardfence.engine.client._records import TaskRecords, _now_iso
from cardfence.engine.client.creation import Creation
from cardfence.engine.client.following import Following
from cardfence.engine.core import events as ev
from cardfence.engine.core import guards
from cardfence.engine.core.lifecycle import TERMINAL
from cardfence.engine.core.messages import submitted_message
from cardfence.engine.core.replay import State
from cardfence.engine.core.views import TaskView
from cardfence.engine.discovery.reads import Discovery
from cardfence.engine.errors import CredentialsMissingError


class Resumption:
    """``resume``: what a task needs before it is followed again after a crash or a move."""

    def __init__(
        self,
        discovery: Discovery,
        records: TaskRecords,
        connections: Connections,
        access: Access,
        creation: Creation,
        following: Following,
    ) -> None:
        self.discovery = discovery
        self.records = records
        self.connections = connections
        self.access = access
        self.creation = creation
        self.following = following

    # -- resume (R9) ---------------------------------------------------------------------------

    async def resume(self, ref: str, *, accept_contract: bool = False) -> TaskView:
        """Reconcile the task with a fresh card before any request to its endpoint (R9), and
        find its remote id if a crash fell between send and record. Raises
        :class:`TaskOrphanedError` (the state untouched) when the card no longer carries its
        skill compatibly. Does not drive; call :meth:`drive` next.

        R15: when the endpoint moved to another origin than the one the task's credentials were
        granted for, they are not sent there; ``accept_contract`` accepts the fresh card's
        contract (R3, ``ContractAccepted`` when it changed) and moves the credentials to the
        endpoint's origin (``CredentialsMoved``)."""
        key = await self.records.find(ref)
        state = await self.records.state(key)
        if state["state"] in TERMINAL or guards.never_created(state):
            return await self.records.view(
                state
            )  # R3: a refused creation is final, never sent again
        await self.following.reconcile_endpoint(key)
        state = await self.records.state(key)
        if accept_contract:
            await self._move_credentials(key, state)
            state = await self.records.state(key)
        if not state.get("remote_task_id"):
            await self._rebind(key, state)
        return await self.records.view(await self.records.state(key))

    async def _move_credentials(self, key: str, state: State) -> None:
        """R15: the caller accepts the origin the task's endpoint moved to, under the contract
        a fresh read finds there (accepted for the agent, R3)."""
        recorded = state.get("authorization") or {}
        old = recorded.get("origin")
        new = normalise_origin(str(state["endpoint"]["url"]))
        if not recorded.get("schemes") or old == new:
            return
        missing = [
            name for name in recorded["schemes"] if not self.access.authorizer.has(new, name)
        ]
        if missing:  # the same schemes, never others (R3): each must be configured there
            needs = "; or ".join(f"[{name}]: not configured for {new}" for name in missing)
            raise CredentialsMissingError(new, str(state["skill"]), needs)
        read = await self.discovery.read(str(state["agent_url"]), fresh=True)
        await self.discovery.check_contract(read, accept=True)
        moved = ev.CredentialsMoved(old=old, new=new, revision=read.card.revision, at=_now_iso())
        await self.records.record(key, [moved])

    async def _rebind(self, key: str, state: State) -> None:
        """The send may or may not have reached the agent: ask it for our context's tasks."""
        if await self.creation.found_sent(key, state):
            return
        # Never reached the agent: sending it now is a creation (R3), gated like one: a fresh
        # card (R2) that still offers the skill for the message's parts and accepted modes,
        # under the task's frozen contract -- wherever the endpoint now is. Same messageId, so
        # an agent that did get the first send can tell. The message lives in TaskSubmitted only
        # (kept out of the projection, rewritten every step): the same parts, metadata,
        # references and accepted modes go again.
        # R17: its parts' content and its metadata read back from the content records.
        submitted = await self.records.calls.run(self.records.log.first_event, key)
        message = submitted_message(submitted)
        await self.creation.resend_gate(key, state, message)
        state = await self.records.state(key)
        await self.creation.send_creation(
            key,
            await self.connections.task_transport(state),
            message,
            state["message_id"],
            state["context_id"],
            state["skill"],
        )
