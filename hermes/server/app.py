"""The server's application: the store, the accounts, the fair-share pool, the REST API and the dashboard.

Layout of the server's root directory: ``hermes.db`` (SQLite, unless a database URL is given) and
``users/<name>/``, each user's area. A submitted spec is read as if its file lay in its owner's
area (in the folder ``hermes submit`` names, the spec's own relative to where it was run): relative
paths start there, and every file it names (its workdir, storage dir, a function's
module, a command's paths) must lie inside it (``hermes.server.area``); an admin's too. It is
stored with those paths resolved, and checked again when the pool takes it up.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import logging
import math
import os
import re
import signal
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from hermes.errors import HermesError, HostLimit, SpecError, start_thread
from hermes.experiment import ExperimentSpec, parse_spec
from hermes.experiment.spec import refuse_shell_words
from hermes.pool import PoolSession, parse_present, ran_before, stored_form
from hermes.server.area import (
    document_problems,
    place_problem,
    spec_problems,
    text_problem,
)
from hermes.server.auth import Accounts
from hermes.server.config import ServerConfig
from hermes.server.digest import ExperimentDigest
from hermes.session import STORE_FILE
from hermes.store import (
    ExperimentRecord,
    ExperimentStatus,
    SqlStore,
    StoreError,
    StoreFull,
    StoreUnavailable,
)
from hermes.store.base import DamagedRecord

log = logging.getLogger("hermes.server")

STATIC = Path(__file__).parent / "static"
DIGESTS_KEPT = 200  # ended experiments whose digest stays in memory, the least recently read dropped (rebuilt if asked)
OPEN = [status for status in ExperimentStatus if not status.is_final]  # an open experiment's digest is always kept
POOL_RESTART_S = (1.0, 30.0)  # a pool stopped by an error starts again after the first, doubling up to the second
POOL_STOP_S = 30.0  # seconds ``Hermes.close`` waits for the pool to stop before the server exits without it
SWAGGER_UI = "static/vendor/swagger-ui"  # Swagger UI for /docs, vendored (VERSION there), as the dashboard's charts
# What the server's pages may load, on every answer: this origin's scripts, styles, images and API alone, so that no
# other site's script runs where the dashboard keeps the user's token (localStorage), and no other site's page frames
# them to trick a click (frame-ancestors; X-Frame-Options for older browsers). Inline scripts only by their hash (the
# one /docs starts Swagger UI with). Inline styles are taken: the dashboard's colour swatches and ECharts's tooltips are
# style attributes, and a style runs no code (img-src keeps its url() here). data: images: Swagger UI's icons are.
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
                           "img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
                           "frame-ancestors 'none'")


class Hermes:
    """What the routes share: one per application."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store = SqlStore(config.database_url)
        self.accounts = Accounts(config.database_url)
        self.pool = self._new_pool()
        self._pool_thread = threading.Thread(target=self._run_pool, name="hermes-pool", daemon=True)
        self._closing = threading.Event()
        self._pool_lock = threading.Lock()  # ``close`` stops the pool that runs, not one replaced meanwhile
        self._digests: OrderedDict[int, ExperimentDigest] = OrderedDict()  # least recently read first
        self._open: set[int] = set()  # of those, the experiments open when last read: their digests are kept
        self._digests_lock = threading.Lock()
        self._ended: dict[int, tuple[ExperimentRecord, dict[str, Any]]] = {}  # ended experiments' overviews
        self._pool_failure: tuple[str, float] | None = None  # why the pool last stopped, and when it starts again

    def parse(self, data: dict[str, Any], owner: str, folder: str = "") -> ExperimentSpec:
        """A submitted spec, as ``read`` reads it; its command is new input, which ``refuse_shell_words`` checks too."""
        spec = self.read(data, owner, folder)
        refuse_shell_words(spec, "spec")
        return spec

    def read(self, data: dict[str, Any], owner: str, folder: str = "", *, stored: bool = False) -> ExperimentSpec:
        """The spec as its owner's area reads it, as if its file lay in ``folder`` there (relative to
        the area); SpecError names the fields that are wrong.

        Every file it names must lie in the area (``hermes.server.area``), and that is checked on
        the document first, so that validation never looks at a file outside the area (it would
        say whether the file exists, or which functions a module outside defines).

        Any other error while checking it is a SpecError too, with a line saying what failed (the traceback
        goes to the log): a spec is the caller's input, and its refusal a 422, never a 500; the pool that
        reads it again fails that experiment alone. ``stored``: a stored spec read back (``parse_spec``).
        """
        try:
            return self._parse(data, owner, folder, stored)
        except SpecError:
            raise
        except Exception as error:
            log.exception("checking a spec of %s failed", owner)
            why = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
            raise SpecError(f"spec: the server could not check it ({why}); its log has the details") from None

    def _parse(self, data: dict[str, Any], owner: str, folder: str, stored: bool) -> ExperimentSpec:
        area = self.config.area(owner)
        problem = text_problem(folder)
        if problem is not None:  # no path holds it: resolving it would fail
            raise SpecError(f"folder: {folder!r} {problem}", [("folder", problem)])
        problem = place_problem(area / folder, area.resolve())
        if problem is not None:
            raise SpecError(f"folder: {folder!r} {problem}", [("folder", f"{folder!r} {problem}")])
        base = (area / folder).resolve()
        _refuse(document_problems(data))
        _refuse(spec_problems(parse_spec(data, source="spec", stored=stored), area, self.config.root, base))
        return parse_present(data, source="spec", base_dir=base, stored=stored)

    def read_spec(self, experiment: ExperimentRecord) -> ExperimentSpec:
        """A stored spec as the pool runs it: checked again when the pool takes it up (it may have
        waited, queued, while links in the area changed; or been stored before a check was added). A path out of
        the area fails it; a workdir or module that is missing, once it is confined, leaves it waiting
        (SpecFilesMissing): a shared mount not up yet when the server starts, say."""
        if experiment.owner is None:
            raise SpecError(f"experiment {experiment.name} was not submitted to the server")
        return self.read(self._placed(experiment.spec, experiment.owner), experiment.owner,
                         stored=ran_before(experiment))

    def experiment_dir(self, experiment: ExperimentRecord) -> Path | None:
        """Where the experiment's trials keep their files (``<storage.dir>/<name>``), read from the
        stored spec; None where that is outside its owner's area. An experiment that ``hermes run``
        wrote into the server's database (no owner) keeps them beside it, in the root. Resolved; None also where
        the server cannot read it (its links loop, say). Resolved once, and that path checked: a check of the path,
        then a resolve of it again, took whatever link the user swapped in between (another user's experiment)."""
        if experiment.owner is None:
            return (self.config.root / experiment.name).resolve()
        area = self.config.area(experiment.owner).resolve()  # a link to a shared mount, say
        storage = self._placed(experiment.spec, experiment.owner).get("storage", {}).get("dir", "runs")
        try:
            directory = (area / str(storage) / experiment.name).resolve()
        except (OSError, RuntimeError):  # links that loop (RuntimeError before Python 3.13)
            return None
        return directory if place_problem(directory, area) is None else None

    def _placed(self, spec: dict[str, Any], owner: str) -> dict[str, Any]:
        """``owner``'s stored spec with its workdir and storage dir where they are now (``_moved_here``)."""
        placed = dict(spec)
        for section, field in (("trial", "workdir"), ("storage", "dir")):
            part = placed.get(section)
            if isinstance(part, dict) and isinstance(part.get(field), str):
                placed[section] = {**part, field: self._moved_here(part[field], owner)}
        return placed

    def _moved_here(self, path: str, owner: str) -> str:
        """A path of ``owner``'s stored spec, read under this root. The store keeps them absolute (``stored``), under
        the root of the server that took the spec, or under the area's target where the area is a link to a shared
        mount. One outside this root and the area's target that lies in ``users/<owner>/`` (the last such pair of
        its folders) was stored before the root moved or was copied here, and lies in the area here at the same
        place, where it exists no more, or where the folder above that ``users`` is another server's root (a copy
        kept as a backup: its experiments failed for good here, "outside your area"); any other stays as stored
        (relative: from the area). A link's target is never moved: its own path may hold ``users/<owner>``
        (``/nfs/users/alice/hermes``), and its experiments waited for ever for files at a place in the area that
        held none."""
        stored = Path(path)
        area = self.config.area(owner)
        if not stored.is_absolute() or stored.is_relative_to(self.config.root.resolve()):
            return path
        if stored.is_relative_to(area.resolve()):  # an area linked out, its storage dir not made yet
            return path
        parts = stored.parts
        pairs = [index for index in range(len(parts) - 1) if parts[index:index + 2] == ("users", owner)]
        if not pairs or os.path.exists(stored) and not _server_root(Path(*parts[:pairs[-1]])):
            return path
        return str(area.joinpath(*parts[pairs[-1] + 2:]))

    def stored(self, spec: ExperimentSpec) -> dict[str, Any]:
        """The spec as the store keeps it: its paths resolved in its owner's area, so that the pool reads it alike."""
        data = stored_form(spec)
        data["trial"]["workdir"] = str(spec.workdir)
        data["storage"]["dir"] = str(spec.storage_dir)
        return data

    def digest(self, experiment: ExperimentRecord) -> ExperimentDigest:
        """The experiment's digest, brought up to date. Every open experiment's is kept, and ``DIGESTS_KEPT`` of ended
        ones, the least recently read dropped: a long-lived server sees thousands of experiments, and a digest holds
        every trial and run of its experiment. Dropping open ones too made the list thrash once more experiments were
        open than that: each poll dropped every digest before it was read again, and rebuilt each from its log."""
        experiment_id = experiment.experiment_id
        with self._digests_lock:
            digest = self._digests.get(experiment_id)
            made = digest is None
            if made:
                digest = self._digests[experiment_id] = ExperimentDigest(self.store, experiment)
            self._digests.move_to_end(experiment_id)
            if experiment.status.is_final:
                self._open.discard(experiment_id)
            else:
                self._open.add(experiment_id)
            self._drop_ended(settle=made and len(self._open) > DIGESTS_KEPT)
        digest.refresh(experiment.status, experiment.error)
        return digest

    def _ended_now(self, experiment_id: int) -> None:
        """Count a kept digest as one of an ended experiment: the list reads an ended one without its digest."""
        with self._digests_lock:
            if experiment_id in self._open:
                self._open.discard(experiment_id)
                self._drop_ended()

    def _drop_ended(self, settle: bool = False) -> None:
        """Drop the least recently read digests of ended experiments past ``DIGESTS_KEPT``. ``settle``: first ask the
        store which experiments are still open, as one that ended while nobody read it (its page closed before) would
        count as open for ever; asked only when a digest is made while more than ``DIGESTS_KEPT`` count as open."""
        if settle:
            self._open &= {record.experiment_id for record in self.store.experiments(status=OPEN)}
        ended = [experiment_id for experiment_id in self._digests if experiment_id not in self._open]
        for experiment_id in ended[: max(len(ended) - DIGESTS_KEPT, 0)]:
            del self._digests[experiment_id]

    def overview(self, experiment: ExperimentRecord) -> dict[str, Any]:
        """What the experiment list shows of it: trials by state, the best. An open experiment's comes from its
        digest; an ended one's changes no more (``is_final``), so it is read once, without the event log, and kept
        apart from the digests (a few numbers each) while its record stays as it was: a list of more experiments
        than ``DIGESTS_KEPT`` dropped each digest before reading it again, so every poll rebuilt every digest from
        its whole log. A record that changed (a failed one run again) has it read again."""
        if not experiment.status.is_final:
            return self.digest(experiment).overview()
        self._ended_now(experiment.experiment_id)
        kept = self._ended.get(experiment.experiment_id)
        if kept is not None and kept[0] == experiment:
            return kept[1]
        overview = ExperimentDigest.ended_overview(self.store, experiment)
        self._ended[experiment.experiment_id] = (experiment, overview)
        return overview

    def start(self) -> None:
        """Run the submitted experiments: the pool, in a thread of its own, until ``close``; once (``serve`` starts
        it before the application). A second server of the same root is refused here, before its pool takes over any
        experiment; a host whose limit of processes leaves no thread for the pool, too (OSError EAGAIN)."""
        if self._pool_thread.ident is not None:
            return
        self.pool.claim()
        start_thread(self._pool_thread)

    def _new_pool(self) -> PoolSession:
        config = self.config
        return PoolSession(self.store, config.root.resolve(), resources=config.resources, poll=config.poll,
                           engine="ray" if config.ray_address else "local", ray_address=config.ray_address or "auto",
                           storage_uri=config.storage_uri, read_spec=self.read_spec)

    def _run_pool(self) -> None:
        """Run the pool until ``close``. A pool that an error stopped (its database gone for a moment, a
        PostgreSQL restart) starts again from the store, as a restarted server continues: before, the server
        went on taking submissions that nothing ran, and showed its experiments running."""
        delay = POOL_RESTART_S[0]
        while True:
            try:
                self.pool.run()
                return  # stopped by close
            except Exception as error:
                if self.pool.ran:  # it ran since the last error: a new outage waits the first delay, not the last
                    delay = POOL_RESTART_S[0]
                log.exception("the pool stopped; it starts again from the store in %.0f s", delay)
                self._pool_failure = (_pool_stop_reason(error), time.monotonic() + delay)
            if self._closing.wait(delay):
                return
            delay = min(2 * delay, POOL_RESTART_S[1])
            with self._pool_lock:
                if self._closing.is_set():
                    return
                self.pool = self._new_pool()

    def pool_stopped(self) -> str | None:
        """Why the pool runs nothing now, while it waits to start again after an error (a full disk, a database
        gone); None while it runs. Its experiments stayed marked running in the store, which could not record them
        interrupted: the API shows them interrupted, with this reason, and their bars stop growing."""
        failure = self._pool_failure
        if failure is None or self.pool.running.is_set():
            return None
        why, restart_at = failure
        wait = restart_at - time.monotonic()
        when = f"it starts again in {math.ceil(wait):.0f} s" if wait > 0 else "it is starting again"
        return (f"the pool stopped: {why}; {when}, and its experiments then continue from their checkpoints "
                "(the server's log says more)")

    def close(self) -> None:
        """Stop the pool (its trials stop; running experiments are continued by the next start).

        A pool that has not stopped within ``POOL_STOP_S`` (its thread stuck: in a write to a store that another
        process holds locked, say) is left to the end of the process, and the log says so: the server ignored
        SIGTERM for as long. The store is left as a ``kill -9`` leaves it, which the next start continues from: each
        write is a transaction, the trials die with the process, and the pool's claim on the store ends with it."""
        with self._pool_lock:
            self._closing.set()
            self.pool.stop()
        if self._pool_thread.ident is not None:  # started (a server that runs no experiments has none)
            self._pool_thread.join(POOL_STOP_S)
            if self._pool_thread.is_alive():
                log.error("the pool did not stop within %g s: the server exits without it; the next start "
                          "continues its experiments", POOL_STOP_S)
        self.accounts.close()


def _refuse(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise SpecError("spec: " + "; ".join(f"{field}: {problem}" for field, problem in problems), problems)


class SecurityHeaders:
    """Adds the Content-Security-Policy (``CONTENT_SECURITY_POLICY``), X-Frame-Options and X-Content-Type-Options
    to every answer; one that carries its own policy (/docs, with its inline script's hash) keeps it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY.format(hashes=""))
                headers.setdefault("X-Frame-Options", "DENY")
                headers.setdefault("X-Content-Type-Options", "nosniff")  # a file is only ever what its type says
            await send(message)

        await self.app(scope, receive, sending)


def _server_root(folder: Path) -> bool:
    """Whether ``folder`` is a Hermes server's root: it holds the store, or the pool's folder once a pool ran there."""
    return (folder / STORE_FILE).is_file() or (folder / "pool").is_dir()


def docs_page(title: str, openapi_url: str) -> tuple[bytes, str]:
    """/docs: FastAPI's Swagger UI page on the vendored Swagger UI (FastAPI's own loads it from a CDN, unpinned, on the
    dashboard's origin), and the policy that lets its inline script run, by its SHA-256."""
    page = get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} API", swagger_favicon_url="static/favicon.svg",
                               swagger_js_url=f"{SWAGGER_UI}/swagger-ui-bundle.js",
                               swagger_css_url=f"{SWAGGER_UI}/swagger-ui.css")
    scripts = re.findall(rb"<script>(.*?)</script>", page.body, re.DOTALL)
    hashes = "".join(f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'" for script in scripts)
    return page.body, CONTENT_SECURITY_POLICY.format(hashes=hashes)


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413, by its Content-Length or while it streams in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await _too_large(self.limit, send)
            return
        received = 0
        refused = False

        async def counted() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # answer now; whatever the app answers later is dropped
                refused = True
                await _too_large(self.limit, send)
                return {"type": "http.disconnect"}
            return message

        async def sending(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, sending)


async def _too_large(limit: int, send: Send) -> None:
    response = JSONResponse({"detail": f"the request body is over the limit of {limit} bytes"}, status_code=413)
    await response({"type": "http"}, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class RedactTokens(logging.Formatter):
    """Belt and braces: tokens are never accepted in URLs, but one pasted into a URL, or into any
    message or traceback, is still blanked in the line a handler writes."""

    PATTERN = re.compile(r"hermes_[A-Za-z0-9_-]{40,}")  # a token's 43 characters, a token cut a little short: not
    # a database or a folder named hermes_something

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return self.PATTERN.sub("hermes_<redacted>", self.inner.format(record))


def create_app(config: ServerConfig) -> FastAPI:
    from hermes.server.api import router

    hermes = Hermes(config)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if config.run_experiments:
            hermes.start()
        yield
        hermes.close()

    app = FastAPI(
        title="Hermes",
        summary="Submit HPO experiments to a shared GPU pool and watch them run.",
        description="Every /api request needs `Authorization: Bearer <token>` (`hermes server add-user`).",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # served below, on the vendored Swagger UI
        redoc_url=None,  # none: a second UI to vendor and keep up to date, for the document /docs shows already
    )
    app.state.hermes = hermes
    app.include_router(router, prefix="/api")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    # Relative URLs, in the dashboard's pages too: behind a proxy that serves it under a path (/hermes/), they
    # resolve under that path, where /static/... left it for the proxy's own site.
    docs, docs_policy = docs_page(app.title, (app.openapi_url or "/openapi.json").lstrip("/"))

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return HTMLResponse(docs, headers={"Content-Security-Policy": docs_policy})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, but one that echoes ``Infinity``, ``NaN`` or a lone surrogate still is JSON (its own
        fails: a 500)."""
        detail = _echoable(jsonable_encoder(error.errors()))
        return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(DamagedRecord)
    async def damaged(_request: Request, error: DamagedRecord) -> JSONResponse:
        """A 500 that says which record, and what to do: a bare "Internal Server Error" said neither. A 500, as the
        request is sound and asking again gives the same; only the server's administrator can mend the store."""
        log.warning("%s", error)  # with the store's file, which the answer leaves out
        return JSONResponse({"detail": damage_detail(error)}, status_code=status.HTTP_500_INTERNAL_SERVER_ERROR)

    @app.exception_handler(StoreUnavailable)
    async def unavailable(_request: Request, error: StoreUnavailable) -> JSONResponse:
        """A 503: the store cannot be written now (locked, read-only, its disk refused, its database gone), which
        asking again later may mend. The error names the database, not the caller's business: it goes to the log."""
        log.warning("%s", error)
        return JSONResponse({"detail": STORE_UNAVAILABLE}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)

    @app.exception_handler(StoreError)
    async def store_failed(_request: Request, error: StoreError) -> JSONResponse:
        """A 500 for any other failure of the store (a file cut or overwritten, say), which no retry mends: said in
        the log, with the store's file, which the answer leaves out."""
        log.error("%s", error)
        return JSONResponse({"detail": STORE_FAILED}, status_code=status.HTTP_500_INTERNAL_SERVER_ERROR)

    @app.exception_handler(StoreFull)
    async def full(_request: Request, error: StoreFull) -> JSONResponse:
        """A 507 (Insufficient Storage, the status for a server that cannot store what a request needs): a full disk
        stays full until its administrator frees space, which a 503 (try again later) would not say."""
        log.warning("%s", error)
        return JSONResponse({"detail": STORE_FULL}, status_code=status.HTTP_507_INSUFFICIENT_STORAGE)

    app.add_middleware(BodyLimit, limit=config.max_body)
    app.add_middleware(SecurityHeaders)  # the outermost of the two: a 413 carries the headers too
    return app


STORE_UNAVAILABLE = ("the server's store cannot be used now (its database is locked, read-only, unreachable or "
                     "failing), so nothing of this request was done; try again later, and tell the server's "
                     "administrator if it lasts (the server's log says why)")
STORE_FAILED = ("the server's store failed, and nothing of this request was done; tell the server's administrator "
                "(the server's log says why)")
STORE_FULL = ("the server's store is full (its disk has no space left), so nothing of this request was kept; the "
              "server's administrator must free space")


def _pool_stop_reason(error: Exception) -> str:
    """What every user is told of the error that stopped the pool: no database URL or path, which the log keeps."""
    if isinstance(error, StoreFull):
        return "the server's store is full (its disk has no space left)"
    if isinstance(error, StoreUnavailable):
        return "the server's store cannot be used (its database is locked, read-only, unreachable or failing)"
    if isinstance(error, StoreError):
        return "the server's store failed"
    return f"an error ({type(error).__name__})"


def damage_detail(error: DamagedRecord) -> str:
    """What the API says of a damaged record: the record and what to do, as ``hermes status`` says it
    (``hermes.report.integrity``), less the store's file or URL, which is not the caller's business."""
    return (f"the server's store has a damaged record: {error.record}; its administrator can correct that value, "
            "or restore the store from a backup")


def _echoable(data: Any) -> Any:
    """``data`` as JSON can carry it: each non-finite float as the string Python's float() reads back ("inf",
    "nan"), and text with a lone surrogate (JSON's "\\ud800") escaped, as UTF-8 cannot hold it."""
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, str) and text_problem(data) is not None:
        return data.encode("utf-8", "backslashreplace").decode()
    if isinstance(data, dict):
        return {_echoable(key): _echoable(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_echoable(value) for value in data]
    return data


class HeadTimeout(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has sent no whole request head
    ``timeout_keep_alive`` seconds (uvicorn's, 5 s) after it opened or after its last answer. uvicorn times a
    connection only from an answer, and stops at its next byte: one that connected and sent nothing, or sent a head a
    byte at a time (slowloris), held a socket for ever, and enough of them every file the server may open. uvicorn
    0.54 (pinned) has no setting that closes them (``limit_concurrency`` answers 503 to requests past it, and closes
    no connection); a connection that has sent its head is answered, as before."""

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        self._time_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._time_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _time_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_late)

    def _head_late(self) -> None:
        if self.cycle is None or self.cycle.response_complete:  # no request under way: none has come since
            self.transport.close()


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8600, root_path: str = "") -> None:
    """Run the server until Ctrl-C, SIGTERM (uvicorn handles both) or SIGHUP (its terminal or SSH session closed:
    taken as SIGTERM, so the pool records its experiments interrupted; under nohup it stays ignored).
    ``root_path``: the path a proxy serves it under (/hermes), which the OpenAPI document gives as its server, so
    that /docs's "Try it out" calls the API there; the dashboard's URLs are relative and need none."""
    import uvicorn

    if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
        signal.signal(signal.SIGHUP, lambda *_: os.kill(os.getpid(), signal.SIGTERM))

    app = create_app(config)
    server_config = uvicorn.Config(app, host=host, port=port, http=HeadTimeout, root_path=root_path)  # configures uvicorn's loggers
    hermes_log = logging.getLogger("hermes")  # the server's and the pool's messages
    hermes_log.setLevel(logging.INFO)
    hermes_log.addHandler(logging.StreamHandler())
    for name in ("uvicorn", "uvicorn.access", "uvicorn.error", "hermes"):
        for handler in logging.getLogger(name).handlers:
            handler.setFormatter(RedactTokens(handler.formatter))
    if config.run_experiments:
        app.state.hermes.pool.claim()  # a second server of this root is refused, naming the first
    try:  # before the pool starts: a second server must take over nothing (uvicorn binds after its startup)
        listening = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as error:
        raise HermesError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    if config.run_experiments:
        try:  # here, not in the application's startup, where uvicorn says a failure in a traceback
            app.state.hermes.start()
        except BaseException as error:
            listening.close()
            if not isinstance(error, BlockingIOError):  # EAGAIN: no thread for the pool
                raise
            raise HostLimit(f"the pool cannot start: {error.strerror} (errno {errno.errorcode.get(error.errno)}); "
                            "raise the limit of processes (`ulimit -u`, or a container's pids limit)") from None
    bound_host, bound_port = listening.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    hermes_log.info("Hermes serves on http://%s:%d (the dashboard; the API under /api, its OpenAPI at /docs)", shown,
                    bound_port)
    try:
        uvicorn.Server(server_config).run(sockets=[listening])
    except KeyboardInterrupt:
        # Shut down already: uvicorn re-raises the Ctrl-C it handled once it is done, and with a Ray driver
        # connected in this process that surfaces here as a KeyboardInterrupt, which is no error.
        pass
