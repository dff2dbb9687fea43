"""The one error tree of cardfence.

Every error cardfence raises on purpose derives from :class:`CardfenceError`; each carries what it
is about (URL, task, revision) and its message is one line naming what was wrong and what was (not)
done.

::

    CardfenceError
    ├── StoreError                      the event store refused or failed; nothing was written
    │   ├── ConcurrencyError            another writer appended to the stream first
    │   ├── LeaseLostError              another process claimed the task this one was driving
    │   ├── CorruptRecordError          a stored event or projection altered: not as written
    │   ├── PayloadError                payload not JSON, out of range or too large
    │   ├── SnapshotMismatchError       card body does not hash to its revision key
    │   ├── ContentMismatchError        content does not hash to its digest (R17)
    │   ├── SchemaTooNewError           database migrated by a newer cardfence
    │   └── StoreUnavailableError       database unreachable or broken
    ├── UsageError                      bad flags, unknown task (CLI exit 2)
    │   ├── CredentialsConfigError      credentials file unsafe or malformed, variable unset
    │   ├── FetchRefusedError           an artifact's file URL not fetched: origin, address, R16
    │   └── MessageTooLargeError        a message over the bound on its encoded size (not sent)
    ├── DiscoveryError                  the card could not be read (kind: network, timeout, …)
    │   ├── CardInvalidError            the card body is invalid or over the size limit
    │   │   └── ProtocolUnsupportedError  no interface declares an A2A version we speak
    │   └── CardSignatureError          the card's signatures do not hold under its agent's policy
    ├── SkillUnavailableError           skill absent or media type not accepted
    ├── ExtensionRequiredError          the card requires an extension not activated
    ├── ContractChangedError            the agent's contract differs from the pinned one
    ├── CredentialsMissingError         the contract requires credentials not configured
    ├── TaskOrphanedError               the card in force no longer carries the task's skill
    ├── EndpointUnreachableError        network error or bare HTTP 404 at the task's endpoint
    │   ├── StreamDroppedError          an event stream ended before its task reached a final state
    │   ├── ThrottledError              the agent answered 429 (or 503 with Retry-After): wait
    │   └── AuthorizationFailedError    the agent answered 401/403: credentials refused
    │       └── TokenRequestError       no access token could be had from the token endpoint
    ├── RemoteRefusedError              the agent answered with an A2A error
    │   ├── CreationRefusedError        ... to a creation: final, the task was never created
    │   └── ProtocolMismatchError       ... the endpoint speaks another A2A version than its card's
    ├── OperationUnsupportedError       the endpoint's A2A version has no such operation (not sent)
    ├── InvalidAgentResponseError       the agent's answer is not a valid A2A response
    │   └── WrongTaskAnswerError        the answer is about another task than the one asked
    ├── DeadlineExceeded                the task was not at the requested point in time
    ├── TaskEndedError                  the remote ended the task other than completed
    └── AuditViolation                  the audit found a broken chain or a replay mismatch

The store's part of the tree (:class:`CardfenceError` itself and :class:`StoreError` with its
subclasses) is defined in :mod:`cardfence.store.errors`: ``store`` knows nothing of A2A and cannot
import ``engine``. Import those names from there; here is the rest of the tree.
"""

from __future__ import annotations

from collections.abc import Sequence

from cardfence.store.errors import CardfenceError

__all__ = [
    "AuditViolation",
    "AuthorizationFailedError",
    "CardInvalidError",
    "CardSignatureError",
    "ContractChangedError",
    "CreationRefusedError",
    "CredentialsConfigError",
    "CredentialsMissingError",
    "DeadlineExceeded",
    "DiscoveryError",
    "EndpointUnreachableError",
    "ExtensionRequiredError",
    "FetchRefusedError",
    "InvalidAgentResponseError",
    "MessageTooLargeError",
    "OperationUnsupportedError",
    "ProtocolMismatchError",
    "ProtocolUnsupportedError",
    "RemoteRefusedError",
    "SkillUnavailableError",
    "StreamDroppedError",
    "TaskEndedError",
    "TaskOrphanedError",
    "ThrottledError",
    "TokenRequestError",
    "UsageError",
    "WrongTaskAnswerError",
]


class UsageError(CardfenceError):
    """The command line or API was used wrongly (unknown task, bad option)."""


class CredentialsConfigError(UsageError):
    """The credentials (rule R15) cannot be used: the file is readable by others or malformed, an
    ``env:`` variable it names is unset, or a configured secret does not fit the card's scheme.

    ``origin`` and ``scheme`` name the entry when one is concerned; the message names what is
    wrong and never repeats a secret.
    """

    def __init__(self, where: str, detail: str, *, origin: str = "", scheme: str = "") -> None:
        self.where = where
        self.origin = origin
        self.scheme = scheme
        self.detail = detail
        entry = f' [agents."{origin}"]' if origin else ""
        entry += f" {scheme}" if scheme else ""
        super().__init__(f"credentials {where}{entry}: {detail}")


class FetchRefusedError(UsageError):
    """A file an artifact names by URL that cardfence will not fetch: not a URL it may read
    (R16), at another origin than the task's when that was not allowed, or at a link-local
    address. Nothing was sent."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"{url or 'file part'}: {detail}; nothing was fetched")


class MessageTooLargeError(UsageError):
    """A message whose encoded request (its parts, metadata and the rest of the params) is over
    the engine's bound (``max_message_bytes``): nothing was recorded, nothing was sent."""

    def __init__(self, size: int, bound: int) -> None:
        self.size = size
        self.bound = bound
        super().__init__(
            f"the message is {size} bytes encoded, over the bound of {bound} "
            "(max_message_bytes): nothing was recorded or sent"
        )


class DiscoveryError(CardfenceError):
    """The Agent Card could not be read; nothing that depended on it was done.

    ``kind`` is one of ``network``, ``timeout``, ``http_status``, ``invalid_card``, ``too_large``,
    ``redirect``, ``insecure``, ``signature``, ``unsupported_protocol``
    (:class:`ProtocolUnsupportedError`), ``extended_card`` (the authenticated extended card
    could not be read, R15), ``record`` (the agent's record in the store was altered: not
    read, like a card that cannot be). ``consequence`` says what was (not) done because of
    it; the caller that knows sets it (e.g. the engine: "nothing was sent").
    """

    def __init__(self, url: str, kind: str, detail: str, *, consequence: str = "") -> None:
        self.url = url
        self.kind = kind
        self.detail = detail
        self.consequence = consequence
        super().__init__(url, kind, detail)

    def __str__(self) -> str:
        tail = f" ({self.consequence})" if self.consequence else ""
        return f"GET {self.url} -> {self.detail}{tail}"


class CardInvalidError(DiscoveryError):
    """The card body is not a valid Agent Card, or is over the size limit.

    ``field`` names the offending field (a dotted path) when one can be named.
    """

    def __init__(
        self,
        url: str,
        detail: str,
        *,
        field: str = "",
        kind: str = "invalid_card",
        consequence: str = "",
    ) -> None:
        self.field = field
        super().__init__(url, kind, detail, consequence=consequence)


class CardSignatureError(DiscoveryError):
    """The card's signatures do not hold under its agent's signature policy (``require``, or
    ``prefer`` with a signature present): unsigned where one is required, an algorithm refused
    (``none``, HMAC), a key not in the key set, a signature that does not verify, a key set that
    could not be read or differs from the pinned one. The card was neither used nor stored;
    ``kind`` is ``signature`` and ``detail`` the one-line reason.
    """

    def __init__(self, url: str, detail: str, *, consequence: str = "") -> None:
        super().__init__(url, "signature", detail, consequence=consequence)

    def __str__(self) -> str:
        tail = f" ({self.consequence})" if self.consequence else ""
        return f"GET {self.url} -> card signature refused: {self.detail}{tail}"


class SkillUnavailableError(CardfenceError):
    """The fresh card does not offer the skill, or not for the message's media types."""

    def __init__(self, agent: str, skill: str, detail: str) -> None:
        self.agent = agent
        self.skill = skill
        super().__init__(f"{agent}: skill {skill!r} {detail} (nothing was sent)")


class ExtensionRequiredError(CardfenceError):
    """The fresh card requires an extension (``capabilities.extensions``, ``required: true``)
    that the caller did not activate: a client must comply with it to interact with the agent,
    so no task is created (nothing was sent)."""

    def __init__(self, agent: str, uris: Sequence[str]) -> None:
        self.agent = agent
        self.uris = tuple(uris)
        super().__init__(
            f"{agent}: the card requires the extension {', '.join(self.uris)}, which the task "
            "does not activate: activate it (--extension URI) if the caller complies with it "
            "(nothing was sent)"
        )


class ContractChangedError(CardfenceError):
    """The agent's contract (protocol versions, security) differs from the one pinned."""

    def __init__(self, agent: str, pinned: str, fresh: str, changes: str) -> None:
        self.agent = agent
        self.pinned = pinned
        self.fresh = fresh
        self.changes = changes
        super().__init__(
            f"{agent}: contract changed from {pinned[:12]} to {fresh[:12]} ({changes}); "
            "nothing was sent — accept it explicitly to proceed"
        )


class CredentialsMissingError(CardfenceError):
    """The frozen contract requires security and no alternative of its requirements is covered
    by the configured credentials (R15): a creation refusal, nothing was sent (never a downgrade
    to an unauthenticated request). ``needs`` says, per alternative, what is missing.

    Raised before the task is recorded or anything is sent; the refusal is recorded in the
    agent's stream (``CredentialsMissing``). Raised too, with no ``skill``, before a later
    request of a task whose secret is no longer configured: that request is not sent.
    """

    def __init__(self, agent: str, skill: str, needs: str) -> None:
        self.agent = agent
        self.skill = skill
        self.needs = needs
        what = f"skill {skill!r} requires" if skill else "the task's requests require"
        super().__init__(
            f"{agent}: {what} credentials that are not configured ({needs}); nothing was sent"
        )


class TaskOrphanedError(CardfenceError):
    """The card revision in force no longer carries the task's skill, or an incompatible one."""

    def __init__(self, task: str, skill: str, revision: str, detail: str) -> None:
        self.task = task
        self.skill = skill
        self.revision = revision
        super().__init__(
            f"task {task}: {detail} in card revision {revision[:12]}; "
            "the task keeps its last observed state and was not routed elsewhere"
        )


class EndpointUnreachableError(CardfenceError):
    """The task's endpoint did not answer, or answered 404 without an A2A error body."""

    def __init__(self, url: str, detail: str, *, task: str = "", status: int | None = None) -> None:
        self.url = url
        self.detail = detail
        self.task = task
        self.status = status  # the HTTP status when there was one (404: gone or moved, R11)
        super().__init__(f"{url}: {detail} (nothing was changed)")


class StreamDroppedError(EndpointUnreachableError):
    """An event stream (SubscribeToTask, SendStreamingMessage) ended before its task reached a
    final state (terminal or interrupted). The updates read before it were delivered; the task's
    state is whatever they said. Poll it, and subscribe again if it is still live.

    ``reason``: ``cut`` (the connection broke, or closed inside an event), ``closed`` (the remote
    ended the stream cleanly, too early), ``idle`` (no byte within the idle timeout) or
    ``deadline`` (the deadline in force passed).
    """

    def __init__(self, url: str, reason: str, detail: str, *, task: str = "") -> None:
        self.reason = reason
        super().__init__(url, detail, task=task)

    def __str__(self) -> str:
        about = f" of task {self.task}" if self.task else ""
        return (
            f"{self.url}: event stream{about} dropped ({self.reason}): {self.detail}; "
            "the updates before it were delivered, nothing else was changed"
        )


class ThrottledError(EndpointUnreachableError):
    """The agent asked for time (R5): HTTP 429 (too many requests: nothing was done), or 503
    with a ``Retry-After`` (unavailable: a send's outcome is unknown, R3), without an A2A error
    body. ``retry_after``: the seconds its ``Retry-After`` asked for (``None``: none, or not
    readable). Recorded once per task as ``Throttled``, never a transition."""

    def __init__(self, url: str, status: int, retry_after: float | None, *, task: str = "") -> None:
        self.retry_after = retry_after
        asked = "no wait named" if retry_after is None else f"Retry-After {retry_after:g}s"
        why = "too many requests" if status == 429 else "unavailable"
        super().__init__(url, f"HTTP {status} ({why}; {asked})", task=task, status=status)


class AuthorizationFailedError(EndpointUnreachableError):
    """The agent answered 401 or 403 without an A2A error: the credentials sent were refused
    (R15). Mid-task this is an annotation (``AuthorizationFailed``, flag
    ``credentials_rejected``), never a transition or a cancel (R1): polling goes on with backoff
    after one token refresh. ``schemes`` names the schemes the request was authorised with."""

    def __init__(
        self, url: str, status: int, *, task: str = "", schemes: tuple[str, ...] = ()
    ) -> None:
        self.schemes = schemes
        sent = f"credentials of {', '.join(schemes)}" if schemes else "no credentials"
        super().__init__(url, f"HTTP {status}: the agent refused {sent}", task=task, status=status)


class TokenRequestError(AuthorizationFailedError):
    """No OAuth 2.0 access token could be had for a scheme of the frozen contract: the token
    endpoint (or the OpenID Connect discovery document naming it) could not be reached, refused
    the client, or answered unusably. Nothing was sent to the agent with the missing token.
    ``url`` is the token endpoint's (or the discovery document's) URL; ``detail`` never holds
    a secret."""

    def __init__(
        self, url: str, detail: str, *, scheme: str = "", status: int | None = None
    ) -> None:
        self.scheme = scheme
        self.token_detail = detail
        EndpointUnreachableError.__init__(
            self, url, f"token request{f' for {scheme}' if scheme else ''}: {detail}",
            status=status,
        )  # fmt: skip
        self.schemes = (scheme,) if scheme else ()


class RemoteRefusedError(CardfenceError):
    """The agent answered the request with an A2A error."""

    def __init__(self, url: str, code: int | str, detail: str, *, task: str = "") -> None:
        self.url = url
        self.code = code
        self.detail = detail
        self.task = task
        super().__init__(f"{url}: agent refused ({code}: {detail})")


class CreationRefusedError(RemoteRefusedError):
    """The agent refused a creation with an A2A error (R3): final, the task was never created,
    and no ``resume`` sends it again."""

    def __str__(self) -> str:
        return (
            f"{self.url}: agent refused the creation ({self.code}: {self.detail}); "
            f"task {self.task} is closed as never created and will not be sent again"
        )


class ProtocolMismatchError(RemoteRefusedError):
    """The endpoint speaks another A2A version than its card declares for it: it answered
    JSON-RPC -32601 (method not found) to a method of the declared version (0.3 names them
    ``message/send``, ``tasks/get``, …; 1.0 ``SendMessage``, ``GetTask``, …), -32009 (version not
    supported), or, declared 0.3, an error only 1.0 sends. Nothing was changed.

    ``declared`` is the card's version, ``spoken`` the one the answer points to, ``method`` the
    one refused and ``legacy`` its name in ``spoken``; ``code`` is the agent's (-32601 unless
    given), ``answer`` the agent's own message when it is not -32601's.
    """

    def __init__(
        self,
        url: str,
        method: str,
        *,
        declared: str,
        spoken: str = "",
        legacy: str = "",
        task: str = "",
        code: int | str = -32601,
        answer: str = "",
    ) -> None:
        self.method = method
        self.declared = declared
        self.spoken = spoken or ("1.0" if declared.startswith("0.") else "0.3")
        self.legacy = legacy
        if code == -32601:
            why = f"it does not know the method {method}"
            why += f", which {self.spoken} calls {legacy}" if legacy else ""
        else:
            why = f"it refused {method} with {code}" + (f" ({answer})" if answer else "")
        super().__init__(
            url,
            code,
            f"the card says A2A {declared or '(none)'}, the endpoint speaks another version "
            f"({self.spoken} perhaps): {why}",
            task=task,
        )

    def __str__(self) -> str:
        return f"{self.url}: protocol mismatch: {self.detail} (nothing was changed)"


class ProtocolUnsupportedError(CardInvalidError):
    """No interface of the card that cardfence could otherwise use declares an A2A version it
    speaks (1.x, 0.3 or 0.2): refused at discovery, before anything is sent. ``offered`` are
    the versions the card declares."""

    def __init__(self, url: str, offered: tuple[str, ...], *, consequence: str = "") -> None:
        self.offered = offered
        versions = ", ".join(repr(v) for v in offered) or "none"
        super().__init__(
            url,
            f"no interface speaks an A2A version cardfence speaks (1.x, 0.3, 0.2); "
            f"the card declares {versions}",
            field="supportedInterfaces",
            kind="unsupported_protocol",
            consequence=consequence,
        )


class OperationUnsupportedError(CardfenceError):
    """The operation does not exist in the A2A version the endpoint speaks (0.3 has no
    ``ListTasks``): nothing was sent. ``resume`` then cannot tell whether a send whose outcome
    was unknown reached the agent, and sends nothing."""

    def __init__(self, url: str, operation: str, *, version: str, task: str = "") -> None:
        self.url = url
        self.operation = operation
        self.version = version
        self.task = task
        super().__init__(
            f"{url}: {operation} is not part of A2A {version}, which the endpoint speaks: "
            "not sent (nothing was changed)"
        )


class InvalidAgentResponseError(CardfenceError):
    """The agent's answer is not a valid A2A response; nothing was changed."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(f"{url}: invalid agent response: {detail} (nothing was changed)")


class WrongTaskAnswerError(InvalidAgentResponseError):
    """The agent answered about another task than the one asked about; nothing was applied."""

    def __init__(self, url: str, asked: str, answered: str, answered_state: str | None) -> None:
        self.asked = asked
        self.answered = answered
        self.answered_state = answered_state
        super().__init__(url, f"asked about task {asked}, answered {answered}")


class DeadlineExceeded(CardfenceError):
    """The task did not reach the requested point in time; it is NOT marked failed."""

    def __init__(self, task: str, state: str, seconds: float, *, reason: str = "") -> None:
        self.task = task
        self.state = state
        self.seconds = seconds
        self.reason = reason
        said = f": {reason} (" if reason else f" ({seconds:.1f}s; "
        super().__init__(
            f"task {task} still {state} at the deadline{said}the task is not marked failed)"
        )


class TaskEndedError(CardfenceError):
    """The remote ended the task other than ``completed`` (failed, canceled, rejected), or, for
    :meth:`Engine.wait_for`, in a terminal state other than the ones awaited."""

    def __init__(self, task: str, state: str, message: str | None) -> None:
        self.task = task
        self.state = state
        said = f": {message}" if message else " (no diagnostic)"
        super().__init__(f"task {task} ended {state} as the remote reported it{said}")


class AuditViolation(CardfenceError):
    """The audit found at least one violation."""

    def __init__(self, count: int, first: str) -> None:
        self.count = count
        super().__init__(f"{count} violation(s); first: {first}")
