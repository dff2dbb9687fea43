"""The ``cards`` benchmark section: parsing Agent Cards and revalidating them against a live agent.

1. ``parse_card`` (decode, tree checks, model, RFC 8785 canonical form, ``revision``,
   ``contract_hash`` and every skill's ``compatibility_hash``/``content_hash``) of a ~2 KB card
   and a ~50 KB card, vs a plain ``json.loads`` of the same bytes. Both cards have the shape
   the test peer serves (a2a-sdk 1.3, A2A v1.0 JSON) plus security schemes and requirements;
   the 50 KB one has many skills with descriptions and examples, a third of them with their own
   security requirements, so the contract hash has real work.
2. ``Discovery.read(fresh=True)`` against a real a2a-sdk agent on 127.0.0.1 (``tests/support``)
   serving the ~2 KB card, recording into a SQLite store (a temporary file):

   - the card unchanged: a conditional GET with the stored ETag, a 304, and ``CardFetched``
     appended to the agent's stream (the steady state of a long-lived engine: the stored
     revision is the one in memory, so nothing is re-parsed);
   - the card changed before every read (its ``version`` bumped): a 200, a parse, a new
     snapshot stored and ``CardFetched`` appended.

   Both against the same baseline: a plain ``httpx.AsyncClient.get`` of the card URL (200, full
   body, nothing parsed, nothing stored) on the same client, so the same connection pool.

The agents run in threads of this process (they share the GIL with the client), so every round
trip, the baseline's included, pays for the server's work too: the ratios of part 2 are those of
whole round trips on one machine, not of the client's work alone. The agents' sockets are bound
with ``TCP_NODELAY`` on every connection (``engine.demo.server.bind``): without it every 200 would
wait ~40 ms for a delayed ACK and the baseline would measure that stall. Cards are built before
the clock starts; only the ``version`` bump of the changing card runs inside the timed loop.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
from bench import BenchContext, Figure, Workload, median_rates, register
from bench_store import sqlite_database
from support import Peer
from support.auth_peer import api_key_scheme, requirement

from cardfence.engine.cards.model import parse_card
from cardfence.engine.discovery.fetch import CardLimits
from cardfence.engine.discovery.reads import Discovery
from cardfence.store.event_store import EventStore

SMALL_BYTES = 2 * 1024
LARGE_BYTES = 50 * 1024
LIMITS = CardLimits(max_bytes=1_048_576)


@dataclass(frozen=True, slots=True)
class Sizes:
    """Work per timed run (each figure is the median of ``ctx.runs`` such runs)."""

    small_parses: int  # ~2 KB cards parsed
    large_parses: int  # ~50 KB cards parsed
    reads: int  # round trips to the agent

    @classmethod
    def for_context(cls, ctx: BenchContext) -> Sizes:
        if ctx.quick:
            return cls(small_parses=100, large_parses=5, reads=10)
        return cls(small_parses=2000, large_parses=100, reads=200)


# -- cards -----------------------------------------------------------------------------------------

_SCOPES = {
    "tasks:read": "Read the tasks you created and their artifacts.",
    "tasks:write": "Create tasks, send messages to them and cancel them.",
    "push:manage": "Register and remove push notification configurations.",
    "reports:read": "Read generated reports.",
}


def security_schemes() -> dict[str, Any]:
    """One scheme of each A2A v1.0 kind, in proto JSON (each wrapped in its oneof key)."""
    return {
        "oauth": {
            "oauth2SecurityScheme": {
                "description": "OAuth 2.0 with the agent's authorization server.",
                "flows": {
                    "authorizationCode": {
                        "authorizationUrl": "https://auth.example.com/oauth2/authorize",
                        "tokenUrl": "https://auth.example.com/oauth2/token",
                        "refreshUrl": "https://auth.example.com/oauth2/token",
                        "scopes": dict(_SCOPES),
                        "pkceRequired": True,
                    },
                },
                "oauth2MetadataUrl": "https://auth.example.com/.well-known/oauth-authorization-server",
            }
        },
        "apiKey": api_key_scheme("X-API-Key"),
        "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer", "bearerFormat": "JWT"}},
        "mtls": {"mtlsSecurityScheme": {"description": "Client certificate."}},
    }


def security_requirements() -> list[dict[str, Any]]:
    """Two alternatives: OAuth with scopes, or an API key over mutual TLS."""
    return [requirement(oauth=["tasks:read", "tasks:write"]), requirement("apiKey", "mtls")]


def generated_skill(n: int) -> dict[str, Any]:
    """A skill with a paragraph of description and three examples (~800 bytes of JSON)."""
    topic = ("invoice", "contract", "shipment", "ticket", "survey", "ledger", "forecast")[n % 7]
    skill: dict[str, Any] = {
        "id": f"{topic}-{n:03d}",
        "name": f"{topic.title()} analysis {n}",
        "description": (
            f"Reads a {topic} given as text or JSON, checks it against the rules configured for "
            f"workspace group {n % 11}, and returns a structured summary: totals, anomalies with "
            "the evidence for each, and the follow-up questions a reviewer should ask. Long "
            "inputs are processed in the background; poll the task or register a webhook."
        ),
        "tags": [topic, "analysis", f"group-{n % 11}", "structured-output"],
        "examples": [
            f"Summarise this {topic} and list anything unusual: ...",
            f"Compare {topic} #{1000 + n} with last quarter's and explain the differences.",
            f'{{"{topic}_id": "{topic[:3].upper()}-{n:05d}", "checks": ["totals", "dates"]}}',
        ],
        "inputModes": ["text/plain", "application/json"],
        "outputModes": ["application/json", "text/markdown"],
    }
    if n % 3 == 0:
        skill["securityRequirements"] = [requirement(oauth=["reports:read", "tasks:write"])]
    return skill


def card_bytes(card: dict[str, Any]) -> bytes:
    """The card as the agent serves it (Starlette's JSONResponse: compact, UTF-8)."""
    return json.dumps(card, ensure_ascii=False, separators=(",", ":")).encode()


def sized_card(base: dict[str, Any], target_bytes: int) -> dict[str, Any]:
    """``base`` (the peer's card) with security added, then skills until ``target_bytes``."""
    card = copy.deepcopy(base)
    card["securitySchemes"] = security_schemes()
    card["securityRequirements"] = security_requirements()
    skills = card.setdefault("skills", [])
    n = 0
    while len(card_bytes(card)) < target_bytes * 0.95:
        skills.append(generated_skill(n))
        n += 1
    return card


# -- part 1: parsing -------------------------------------------------------------------------------


def parse_each(body: bytes, url: str, count: int) -> Workload:
    def run() -> int:
        for _ in range(count):
            parse_card(body, url=url, max_bytes=LIMITS.max_bytes)
        return count

    return run


def json_loads_each(body: bytes, count: int) -> Workload:
    def run() -> int:
        for _ in range(count):
            json.loads(body)
        return count

    return run


def bench_parsing(
    ctx: BenchContext, cards: dict[str, tuple[bytes, int]], url: str, counts: dict[str, int]
) -> list[Figure]:
    figures: list[Figure] = []
    for label, (body, skills) in cards.items():
        ctx.progress(f"parsing the {label} card")
        card = parse_card(body, url=url, max_bytes=LIMITS.max_bytes)
        if len(card.skills) != skills:  # the figure would be of some other card
            raise AssertionError(f"{label} card parsed to {len(card.skills)} skills, not {skills}")
        count = counts[label]
        rates = median_rates(
            {"json": json_loads_each(body, count), "ours": parse_each(body, url, count)},
            ctx.runs,
        )
        figures.append(
            Figure.compared(
                f"parse_card {label} card ({skills} skills; revision+contract+skill hashes)",
                rates["ours"],
                rates["json"],
                "cards/s",
                None,
            )
        )
    return figures


# -- part 2: revalidation against a live agent ----------------------------------------------------


class Reads:
    """Timed loops of round trips, all on one event loop and one HTTP client."""

    def __init__(self, runner: asyncio.Runner, client: httpx.AsyncClient) -> None:
        self.runner = runner
        self.client = client

    def plain_gets(self, card_url: str, count: int) -> Workload:
        async def loop() -> int:
            for _ in range(count):
                response = await self.client.get(card_url)
                if response.status_code != 200 or not response.content:
                    raise AssertionError(f"plain GET: {response.status_code}")
            return count

        return lambda: self.runner.run(loop())

    def discovery_reads(
        self,
        discovery: Discovery,
        agent_url: str,
        count: int,
        status: int,
        before: Callable[[], object] | None = None,
    ) -> Workload:
        async def loop() -> int:
            for _ in range(count):
                if before is not None:
                    before()
                read = await discovery.read(agent_url, fresh=True)
                if read.status != status:
                    raise AssertionError(f"Discovery.read: {read.status}, expected {status}")
            return count

        return lambda: self.runner.run(loop())


def _card_for(peer: Peer, card: dict[str, Any]) -> dict[str, Any]:
    """``card`` with the peer's own endpoints (its interfaces name its port)."""
    own = copy.deepcopy(card)
    own["supportedInterfaces"] = copy.deepcopy(peer.card["supportedInterfaces"])
    return own


def bench_revalidation(
    ctx: BenchContext, steady: Peer, changing: Peer, card: dict[str, Any], count: int
) -> list[Figure]:
    with ExitStack() as stack:
        ctx.progress("starting the agents and the store")
        for peer in (steady, changing):
            peer.card = _card_for(peer, card)
            peer.start()
        store = EventStore.open(stack.enter_context(sqlite_database()).url)
        stack.callback(store.close)
        runner = stack.enter_context(asyncio.Runner())
        client = httpx.AsyncClient()
        stack.callback(lambda: runner.run(client.aclose()))
        reads = Reads(runner, client)

        confirming = Discovery(store, client, limits=LIMITS)
        refetching = Discovery(store, client, limits=LIMITS)
        # The first reads store the card and its ETag; every later steady read is a 304.
        runner.run(confirming.read(steady.base_url, fresh=True))
        runner.run(refetching.read(changing.base_url, fresh=True))
        bumps = iter(range(1, 1 << 62))

        def bump() -> None:
            version = f"1.0.{next(bumps)}"
            changing.mutate_card(lambda c: c.__setitem__("version", version))

        ctx.progress("revalidating against the local agent")
        rates = median_rates(
            {
                "plain": reads.plain_gets(steady.card_url, count),
                "304": reads.discovery_reads(confirming, steady.base_url, count, 304),
                "200": reads.discovery_reads(refetching, changing.base_url, count, 200, bump),
            },
            ctx.runs,
        )
    unit = "reads/s"
    return [
        Figure.compared(
            "Discovery.read fresh, card unchanged: 304 + CardFetched recorded",
            rates["304"],
            rates["plain"],
            unit,
            None,
        ),
        Figure.compared(
            "Discovery.read fresh, card changed: 200 + parse + snapshot + CardFetched",
            rates["200"],
            rates["plain"],
            unit,
            None,
        ),
    ]


# -- the section -----------------------------------------------------------------------------------


@register("cards")
def cards_section(ctx: BenchContext) -> list[Figure]:
    """Card parsing vs json.loads; Discovery revalidation vs a plain GET of the card."""
    sizes = Sizes.for_context(ctx)
    with ExitStack() as stack:
        # Two agents serving the same card: one never changes it, one changes it before every
        # read. Each has its own origin, so its own agent stream and ETag. Bound now (their
        # URLs go into the cards), started only for part 2.
        steady, changing = Peer(), Peer()
        stack.callback(steady.stop)
        stack.callback(changing.stop)

        small = sized_card(steady.card, SMALL_BYTES)
        large = sized_card(steady.card, LARGE_BYTES)
        cards = {
            "2 KB": (card_bytes(small), len(small["skills"])),
            "50 KB": (card_bytes(large), len(large["skills"])),
        }
        ctx.note(
            "cards: "
            + "; ".join(f"{label} = {len(body):,} bytes" for label, (body, _) in cards.items())
            + "; parse baseline json.loads of the same bytes"
        )
        counts = {"2 KB": sizes.small_parses, "50 KB": sizes.large_parses}
        figures = bench_parsing(ctx, cards, steady.card_url, counts)

        ctx.note(
            "revalidation: a2a-sdk agent in a thread of this process serving the 2 KB card "
            "(weak ETag; TCP_NODELAY on its connections); SQLite store in a "
            "temporary file; baseline a plain httpx GET of the card (200, full body), same client"
        )
        figures += bench_revalidation(ctx, steady, changing, small, sizes.reads)
    return figures
