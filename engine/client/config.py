"""The bounds the engine works within: :class:`EngineConfig`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from cardfence.engine.auth.config import CredentialsProvider
from cardfence.engine.core.observations import DEFAULT_MAX_CLOCK_SKEW
from cardfence.engine.discovery.fetch import CardLimits

# The bound on a message sent (its encoded request params): 8 MiB.
DEFAULT_MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Bounds the engine works within (CLI: ``--max-poll-interval``, ``--max-card-age``, …)."""

    max_poll_interval: float = 30.0
    # R5: the longest wait an agent's Retry-After (a 429, or a 503 with it) is honoured for.
    max_retry_after: float = 300.0
    first_poll_interval: float = 0.1
    max_card_age: float = 120.0
    card_limits: CardLimits = CardLimits()
    request_timeout: float = 30.0
    prefer_bindings: tuple[str, ...] = ()
    # R12: a status timestamp more than this many seconds ahead of its receipt orders nothing.
    max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW
    # Follow a task's event stream (SubscribeToTask) beside the safety polls when the card the
    # task last saw advertises streaming; a silent stream is dropped after this many seconds.
    follow_streams: bool = True
    stream_idle_timeout: float = 60.0
    # R15: ``(agent origin, security scheme name) -> secret`` (a CredentialsConfig from the
    # credentials file, or a host's own secret store); None sends no credentials, so a contract
    # that requires some is refused before sending.
    credentials: CredentialsProvider | None = None
    # Keys the fingerprints the log keeps of each secret (>= 16 bytes; random per process when
    # not given: fingerprints then tell secrets apart within one process only).
    fingerprint_key: bytes | None = dataclasses.field(default=None, repr=False)
    # CA bundle trusted for agents' TLS when the engine makes its own clients (its default one,
    # and one per client certificate for mutual TLS); None: the system's (and SSL_CERT_FILE).
    ca_file: str | None = None
    # Requests (streams aside) in flight at once to any one agent origin, and in all: the others
    # wait their turn inside the engine, each within its own timeout (engine.pool.RequestSlots).
    requests_per_agent: int = 8
    requests_in_flight: int = 32
    # The largest message a task may send (its encoded request params: parts, metadata, ids);
    # a larger one is the caller's error, nothing recorded or sent.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
