"""The A2A 0.3 test agent: the official a2a-sdk 0.3.26 server (``tests/support/agent03/server.py``)
as a subprocess on 127.0.0.1, run by ``.venv-a2a03/bin/python`` (``scripts/venv03.sh``).

`Peer03` mirrors the names of `Peer` / ``DemoAgent`` (``base_url``, ``card_url``, ``jsonrpc_url``,
``rest_url``, ``calls``, ``mutate_card``, ``set_endpoint_gone``, ``set_push_dropped``, ``hold``,
``release``, ``reset``, ``stop``...) so rule tests can be parametrised over both agents; the
switches travel to the subprocess over its ``/_test/`` routes. The wire is A2A 0.3: JSON-RPC
``message/send`` & co. at ``jsonrpc_url``, HTTP+JSON ``/v1/message:send`` & co. under
``rest_url`` (``tests/integration/test_peer03.py`` lists what the agent really sends).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import httpx

from cardfence.engine.demo.agent import CardHit

__all__ = [
    "A2A03_SDK_VERSION",
    "BINDINGS03",
    "CARD_FAULTS03",
    "LEGACY_CARD_PATH03",
    "Peer03",
    "Peer03Error",
    "Venv03Unavailable",
    "a2a03_python",
]

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).resolve().parent / "agent03" / "server.py"
VENV_SCRIPT = ROOT / "scripts" / "venv03.sh"
VENV_VAR = "CARDFENCE_A2A03_VENV"
STAMP = ".cardfence-installed"
A2A03_SDK_VERSION = "0.3.26"
BINDINGS03 = ("JSONRPC", "HTTP+JSON")
CARD_FAULTS03 = frozenset({"503", "404", "hang", "invalid_json", "huge"})
LEGACY_CARD_PATH03 = "/.well-known/agent.json"  # a2a-sdk 0.3 serves the card here too
STARTUP_SECONDS = 20.0
STOP_SECONDS = 5.0
VENV_SECONDS = 900.0
_STDERR_TAIL = 4000


class Peer03Error(RuntimeError):
    """The 0.3 agent could not be started, or its control surface failed."""


class Venv03Unavailable(Peer03Error):
    """``.venv-a2a03`` is missing and could not be made (no network, say)."""


def a2a03_python(*, create: bool = True) -> Path:
    """The interpreter of the a2a-sdk 0.3 venv: ``$CARDFENCE_A2A03_VENV``, else ``.venv-a2a03``
    at the repository root. With ``create``, a missing or unfinished venv is made first by
    ``scripts/venv03.sh`` (quick when it is already there). Raises `Venv03Unavailable`."""
    venv = Path(os.environ.get(VENV_VAR) or ROOT / ".venv-a2a03")
    python = venv / "bin" / "python"
    if python.exists() and (venv / STAMP).exists():
        return python
    if not create:
        raise Venv03Unavailable(f"{venv} is missing or unfinished: run scripts/venv03.sh")
    try:
        done = subprocess.run(
            ["bash", str(VENV_SCRIPT)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=VENV_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise Venv03Unavailable(f"scripts/venv03.sh took over {VENV_SECONDS:g}s") from exc
    if done.returncode != 0:
        raise Venv03Unavailable(
            f"scripts/venv03.sh failed ({done.returncode}): {done.stderr[-_STDERR_TAIL:]}"
        )
    venv = Path(done.stdout.strip().splitlines()[-1])
    return venv / "bin" / "python"


class Peer03:
    """The a2a-sdk 0.3 agent in a subprocess; use as ``with Peer03() as peer:``.

    Unlike `Peer`, the port is known only once started (the subprocess binds port 0 and reports
    it), so the URLs are set by `start`. Stopping sends SIGTERM, waits, then kills.

    Attributes (after `start`):
        port, base_url, card_url, jsonrpc_url, rest_url: where it listens; ``card_url`` is the
            v1.0/0.3 well-known path, the card is served at `legacy_card_url` too.
        process: the ``subprocess.Popen``.
        protocol_version: "0.3.0", what its card says.
        preferred_transport: the binding of its card's main ``url`` ("JSONRPC", the default, or
            "HTTP+JSON": the card prefers HTTP+JSON, and a client taking its preference uses it).
    Live from the subprocess (each read is one HTTP call):
        calls: ``(binding, method)`` per A2A request, binding "JSONRPC" or "REST", method the
            A2A v1.0 operation name as `Peer` logs it ("SendMessage", "GetTask", ...); a JSON-RPC
            method 0.3 lacks is "unknown:NAME", a REST path it lacks "VERB /path".
        wire_calls: ``(binding, wire)``, wire the 0.3 JSON-RPC method ("message/send") or
            ``"VERB /v1/..."`` under ``rest_url``.
        card: the served card (0.3 JSON); card_requests, card_log (`CardHit` per card GET);
        gone_bindings, endpoint_gone, push_dropped, pushes_dropped, card_fault, held.
    """

    card_faults = CARD_FAULTS03
    protocol_version = "0.3.0"
    sdk_version = A2A03_SDK_VERSION

    def __init__(
        self,
        *,
        name: str = "cardfence-peer03",
        version: str = "1.0.0",
        preferred_transport: str = "JSONRPC",
        python: Path | str | None = None,
        startup_timeout: float = STARTUP_SECONDS,
    ) -> None:
        if preferred_transport not in BINDINGS03:
            raise ValueError(
                f"unknown binding {preferred_transport!r}; expected one of {list(BINDINGS03)}"
            )
        self.name = name
        self.version = version
        self.preferred_transport = preferred_transport
        self._python = Path(python) if python is not None else None
        self._startup_timeout = startup_timeout
        self._dir = tempfile.TemporaryDirectory(prefix="cardfence-peer03-")
        self._ready_file = Path(self._dir.name) / "ready.json"
        self._stderr_path = Path(self._dir.name) / "stderr.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None
        self.port = 0
        self.base_url = self.card_url = self.legacy_card_url = ""
        self.jsonrpc_url = self.rest_url = ""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Self:
        if self.process is not None:
            raise Peer03Error("a Peer03 starts once; make a new one to start again")
        python = self._python or a2a03_python()
        command = [
            str(python),
            str(SERVER),
            "--port",
            "0",
            "--ready-file",
            str(self._ready_file),
            "--name",
            self.name,
            "--version",
            self.version,
            "--preferred-transport",
            self.preferred_transport,
        ]
        with self._stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
            )
        try:
            ready = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.port = int(ready["port"])
        self.base_url = str(ready["base_url"])
        self.card_url = str(ready["card_url"])
        self.legacy_card_url = self.base_url + LEGACY_CARD_PATH03
        self.jsonrpc_url = str(ready["jsonrpc_url"])
        self.rest_url = str(ready["rest_url"])
        self._client = httpx.Client(base_url=self.base_url + "/_test", timeout=10.0)
        return self

    def _wait_ready(self) -> dict[str, Any]:
        assert self.process is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            if self._ready_file.exists():
                return dict(json.loads(self._ready_file.read_text()))
            code = self.process.poll()
            if code is not None:
                raise Peer03Error(
                    f"the a2a-sdk 0.3 agent exited with {code} before serving; "
                    f"stderr:\n{self.stderr_text()}"
                )
            time.sleep(0.02)
        raise Peer03Error(
            f"the a2a-sdk 0.3 agent was not serving after {self._startup_timeout:g}s; "
            f"stderr:\n{self.stderr_text()}"
        )

    def stderr_text(self) -> str:
        """The end of what the subprocess wrote on stderr (the SDK logs warnings there)."""
        try:
            return self._stderr_path.read_text(errors="replace")[-_STDERR_TAIL:]
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Terminate the subprocess (SIGTERM), wait, kill it if it lingers. Idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_SECONDS)

    def close(self) -> None:
        """`stop`, then remove the temporary folder (ready file, stderr log)."""
        self.stop()
        with contextlib.suppress(OSError):
            self._dir.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the control surface -----------------------------------------------------------------

    def _control(self, method: str, path: str, body: Any = None) -> Any:
        if self._client is None:
            raise Peer03Error("the 0.3 agent is not running")
        response = self._client.request(method, path, json=body)
        if response.status_code != 200:
            raise Peer03Error(f"{method} /_test{path}: {response.status_code} {response.text}")
        return response.json()

    def _state(self) -> dict[str, Any]:
        return dict(self._control("GET", "/state"))

    @property
    def calls(self) -> list[tuple[str, str]]:
        return [(c["binding"], c["method"]) for c in self._control("GET", "/calls")]

    @property
    def wire_calls(self) -> list[tuple[str, str]]:
        return [(c["binding"], c["wire"]) for c in self._control("GET", "/calls")]

    @property
    def extension_headers(self) -> list[str]:
        """The ``X-A2A-Extensions`` header of each A2A request ("" when it had none)."""
        return [c["extensions"] for c in self._control("GET", "/calls")]

    @property
    def executed_extensions(self) -> list[list[str]]:
        """The extensions the SDK read as activated, per execution of the executor (sorted)."""
        return [list(named) for named in self._state()["executed_extensions"]]

    # card

    @property
    def card(self) -> dict[str, Any]:
        """The served card (0.3 JSON), a copy: use `mutate_card` or assign to change it."""
        return dict(self._control("GET", "/card"))

    @card.setter
    def card(self, value: dict[str, Any]) -> None:
        self._control("POST", "/card", value)

    def mutate_card(self, fn: Callable[[dict[str, Any]], object]) -> None:
        """Apply ``fn`` to a copy of the served card, in place, and serve the result; ``fn``'s
        return value is ignored. Nothing is bumped automatically."""
        card = self.card
        fn(card)
        self.card = card

    def skills(self) -> list[tuple[str, str]]:
        """``(id, description)`` of each skill the served card lists."""
        return [(str(s.get("id")), str(s.get("description", ""))) for s in self.card["skills"]]

    @property
    def card_requests(self) -> int:
        return int(self._state()["card_requests"])

    @property
    def card_log(self) -> list[CardHit]:
        return [
            CardHit(h["path"], h["host"], h["if_none_match"], h["fault"])
            for h in self._state()["card_log"]
        ]

    @property
    def card_fault(self) -> str | None:
        fault = self._state()["card_fault"]
        return None if fault is None else str(fault)

    def set_card_fault(self, kind: str | None) -> None:
        """Make card GETs answer "503" (Retry-After: 1), "404", not at all ("hang"), a truncated
        JSON body ("invalid_json") or a 5 MiB one ("huge"); ``None`` restores them."""
        if kind is not None and kind not in self.card_faults:
            expected = sorted(self.card_faults)
            raise ValueError(f"unknown card fault {kind!r}; expected one of {expected}")
        self._control("POST", "/card_fault", {"fault": kind})

    # A2A endpoint switches

    @property
    def push_dropped(self) -> bool:
        return bool(self._state()["push_dropped"])

    def set_push_dropped(self, dropped: bool) -> None:
        """Silently drop push deliveries; registrations are still accepted (incident 001)."""
        self._control("POST", "/push_dropped", {"dropped": dropped})

    @property
    def pushes_dropped(self) -> int:
        """Deliveries (push x registered config) swallowed while push was dropped."""
        return int(self._state()["pushes_dropped"])

    @property
    def gone_bindings(self) -> frozenset[str]:
        return frozenset(self._state()["gone_bindings"])

    @property
    def endpoint_gone(self) -> bool:
        return bool(self.gone_bindings)

    def set_endpoint_gone(self, gone: bool, binding: str | None = None) -> None:
        """Answer the A2A endpoint of ``binding`` ("JSONRPC" or "HTTP+JSON"; both when None)
        with a plain HTTP 404, no A2A body (incident 002)."""
        if binding is not None and binding not in BINDINGS03:
            raise ValueError(f"unknown binding {binding!r}; expected one of {list(BINDINGS03)}")
        self._control("POST", "/endpoint_gone", {"gone": gone, "binding": binding})

    @property
    def held(self) -> bool:
        return bool(self._state()["held"])

    def hold(self) -> None:
        """Keep ``slow`` tasks working past their N seconds until `release` (or `reset`)."""
        self._control("POST", "/hold")

    def release(self) -> None:
        self._control("POST", "/release")

    def reset(self) -> None:
        """Back to normal service, logs cleared; tasks and card are kept (as `Peer.reset`)."""
        self._control("POST", "/reset")
