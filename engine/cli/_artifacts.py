"""``cardfence artifacts``: a task's artifacts listed, their parts written to a folder
(``docs/cli.md``), each under a name that stays inside it whatever the agent called it."""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

import typer

from cardfence.engine import errors
from cardfence.engine.cli._app import (
    CredentialsOption,
    DbOption,
    DebugOption,
    Globals,
    JsonOption,
    OutputError,
    app,
    check_seconds,
    configured,
    emit,
    open_store,
    options_of,
)
from cardfence.engine.client.artifacts import TaskArtifact, content_of
from cardfence.engine.client.config import EngineConfig
from cardfence.engine.client.engine import Engine
from cardfence.engine.core.parts import DEFAULT_FILE_TYPE, File, Part, media_type_of
from cardfence.engine.http.deadline import until as requests_until
from cardfence.engine.http.pool import engine_client, tls_context

__all__ = ["MAX_NAME_BYTES", "artifacts", "safe_name", "written"]

_T = TypeVar("_T")

# Longest name written, in UTF-8 bytes: within every common file system's 255, room for "-N".
MAX_NAME_BYTES: Final = 200
# What no written name keeps: path separators, NUL and other controls, and what Windows refuses.
_UNSAFE: Final = re.compile(r'[\x00-\x1f\x7f/\\<>:"|?*]')
_RESERVED: Final = re.compile(r"(con|prn|aux|nul|com[0-9]|lpt[0-9])(\..*)?", re.IGNORECASE)


def safe_name(name: str | None, fallback: str) -> str:
    """``name`` as a plain file name that stays in the folder it is written to: its last path
    component, without controls, separators or leading dots, at most :data:`MAX_NAME_BYTES`
    (its extension kept); ``fallback`` (made safe the same way) when nothing is left."""
    for candidate in (name, fallback):
        if not candidate:
            continue
        text = unicodedata.normalize("NFC", candidate)
        text = re.split(r"[/\\]", text)[-1]  # the last component of any path it names
        text = _UNSAFE.sub("_", text).strip().lstrip(".").strip()
        if _RESERVED.fullmatch(text):
            text = "_" + text
        text = _shortened(text)
        if text and text.strip("._ "):
            return text
    return "part"


def _shortened(name: str) -> str:
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    stem, dot, suffix = name.rpartition(".")
    if not dot or len(suffix.encode()) > 16:
        stem, suffix = name, ""
    keep = MAX_NAME_BYTES - len(suffix.encode()) - (1 if suffix else 0)
    cut = stem.encode()[:keep].decode(errors="ignore")
    return f"{cut}.{suffix}" if suffix else cut


def written(folder: Path, name: str, content: bytes) -> Path:
    """Write ``content`` to a new file ``folder/name``, or ``name-2``, ``name-3``... when that
    is taken: never over a file (or a link) already there, never outside ``folder``."""
    stem, dot, suffix = name.rpartition(".")
    if not stem:  # no extension ("README"), or none before the dot
        stem, dot, suffix = name, "", ""
    for number in range(1, 10_000):
        candidate = name if number == 1 else f"{stem}-{number}{dot}{suffix}"
        path = folder / candidate
        if Path(candidate).name != candidate or candidate in ("", ".", ".."):  # one component
            raise OutputError(f"{candidate!r}: not a name inside {folder}")
        try:
            with path.open("xb") as out:  # exclusive: a name taken, even by a link, is skipped
                out.write(content)
        except FileExistsError:
            continue
        except OSError as failure:
            raise OutputError(f"cannot write {path}: {failure.strerror or failure}") from None
        return path
    raise OutputError(f"{folder}: no free name for {name!r}")


@dataclass(frozen=True, slots=True)
class _Listed:
    """One part as listed: what it is, and where it was written (None: not written)."""

    part: Part
    content: bytes | None
    path: Path | None

    def to_json(self) -> dict[str, Any]:
        part = self.part
        document: dict[str, Any] = {
            "kind": part.kind,
            "media_type": media_type_of(part),
            "filename": part.filename if isinstance(part, File) else None,
            "size": None if self.content is None else len(self.content),
            "sha256": None if self.content is None else hashlib.sha256(self.content).hexdigest(),
            "path": None if self.path is None else str(self.path),
        }
        if isinstance(part, File) and part.url is not None:
            document["url"] = part.url
        return document


def _name_for(artifact: TaskArtifact, number: int, part: Part) -> str:
    """Where a part goes: a file under its own name (else its URL's last segment), a text part
    as ``ARTIFACT_ID-N.txt``, a data part as ``ARTIFACT_ID-N.json``."""
    base = f"{artifact.artifact_id}-{number}"
    if isinstance(part, File):
        named = part.filename or (part.url or "").split("?")[0].split("#")[0].rstrip("/")
        guessed = mimetypes.guess_extension(part.declared_type) or ""
        if part.declared_type == DEFAULT_FILE_TYPE:
            guessed = ".bin"
        return safe_name(named, safe_name(base, "part") + guessed)
    return safe_name(base, "part") + (".txt" if part.kind == "text" else ".json")


def _artifact_json(artifact: TaskArtifact, listed: list[_Listed]) -> dict[str, Any]:
    document: dict[str, Any] = {
        "artifact_id": artifact.artifact_id,
        "name": artifact.name,
        "parts": [entry.to_json() for entry in listed],
        "truncated": artifact.truncated,
    }
    if artifact.truncated:
        document["size"] = artifact.size
        document["sha256"] = artifact.sha256
    if artifact.unread:
        document["unread"] = artifact.unread
    if artifact.partial:
        document["partial"] = True
    return document


def _artifact_text(artifact: TaskArtifact, listed: list[_Listed]) -> str:
    head = f"artifact {artifact.artifact_id}"
    if artifact.name and artifact.name != artifact.artifact_id:
        head += f" ({artifact.name})"
    if artifact.truncated:
        digest = (artifact.sha256 or "")[:12]
        return f"{head}: kept only as its size and digest ({artifact.size} bytes, {digest})"
    lines = [head]
    for number, entry in enumerate(listed, start=1):
        part = entry.part
        what = [f"  {number}. {part.kind:<4}", media_type_of(part)]
        if isinstance(part, File) and part.filename:
            what.append(repr(part.filename))
        if entry.content is not None:
            what.append(
                f"{len(entry.content)} B  sha256 {hashlib.sha256(entry.content).hexdigest()[:12]}"
            )
        if isinstance(part, File) and part.url is not None:
            what.append(part.url)
        if entry.path is not None:
            what.append(f"-> {entry.path}")
        lines.append("  ".join(what))
    if artifact.unread:
        lines.append(f"  ({artifact.unread} part(s) recorded without content that can be read)")
    if artifact.partial:
        lines.append("  (its first chunks never reached cardfence)")
    return "\n".join(lines)


def _run(options: Globals, deadline: float, job: Callable[[Engine], Awaitable[_T]]) -> _T:
    """``job`` on an engine of the store already there; every request ends by ``deadline``."""
    config = configured(options, EngineConfig())
    store = open_store(options, existing=True, deadline=deadline)

    async def main() -> _T:
        async with engine_client(tls_context(config.ca_file)) as client:
            engine = Engine(store, client, config)
            try:
                with requests_until(deadline):
                    return await job(engine)
            finally:
                await engine.aclose()

    return asyncio.run(main())


@app.command()
def artifacts(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(metavar="TASK", help="Local key or remote task id.")],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="DIR",
            help="Write each part to DIR (made if missing): a file under its name, made unique, "
            "a text part as ARTIFACT_ID-N.txt, a data part as ARTIFACT_ID-N.json.",
        ),
    ] = None,
    fetch: Annotated[
        bool,
        typer.Option(
            "--fetch",
            help="Also download the file parts given by URL (with --out), from the task's own "
            "origin only, with the task's credentials.",
        ),
    ] = False,
    fetch_any: Annotated[
        bool,
        typer.Option(
            "--fetch-any",
            help="As --fetch, from any origin too (never a link-local address); credentials go "
            "to the task's own origin only.",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds the command may take.")
    ] = 300.0,
    credentials: CredentialsOption = None,
    db: DbOption = None,
    json_: JsonOption = False,
    debug: DebugOption = False,
) -> None:
    """List the task's artifacts and their parts; with --out, write them to a folder."""
    options = options_of(ctx, db, json_, debug, credentials)
    check_seconds("--timeout", timeout)
    fetch = fetch or fetch_any
    if fetch and out is None:
        raise errors.UsageError("--fetch writes what it downloads: give --out DIR")
    if out is not None and out.exists() and not out.is_dir():
        raise errors.UsageError(f"--out {out}: not a folder; nothing was written")
    deadline = time.monotonic() + timeout

    async def job(engine: Engine) -> tuple[str, list[TaskArtifact], list[bytes]]:
        key = (await engine.task(task)).key
        found = await engine.artifacts(key)
        linked = [p for a in found for p in a.parts if isinstance(p, File) and p.url is not None]
        fetched = await engine.fetch_files(key, linked, any_origin=fetch_any) if fetch else []
        return key, found, fetched

    key, found, fetched = _run(options, deadline, job)
    downloads = iter(fetched)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as failure:
            raise OutputError(f"cannot make {out}: {failure.strerror or failure}") from None
    listing: list[tuple[TaskArtifact, list[_Listed]]] = []
    for artifact in found:
        listed = []
        for number, part in enumerate(artifact.parts, start=1):
            linked = isinstance(part, File) and part.url is not None
            content = next(downloads) if linked and fetch else content_of(part)
            path = None
            if out is not None and content is not None:
                path = written(out, _name_for(artifact, number, part), content)
            listed.append(_Listed(part, content, path))
        listing.append((artifact, listed))
    document = {"task": key, "artifacts": [_artifact_json(a, parts) for a, parts in listing]}
    human = "\n".join([f"task {key}", *(_artifact_text(a, parts) for a, parts in listing)])
    if not found:
        human += "\nno artifacts"
    emit(options, document, human if not options.json else "")
