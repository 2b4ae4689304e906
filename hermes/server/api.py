"""The REST API under /api. Every route needs a token; another user's experiment is answered 404, as if absent.

Reads that grow while an experiment runs take a cursor (``after``, ``since``) and return the next
one, so a client that polls fetches only what is new.
"""

from __future__ import annotations

import errno
import math
import os
import re
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from hermes.core.events import Event, TrialExited, TrialReported
from hermes.core.share import MAX_WEIGHT, MIN_WEIGHT
from hermes.errors import SpecError
from hermes.local.system import open_regular
from hermes.server.app import Hermes, damage_detail
from hermes.server.auth import User
from hermes.server.digest import ExperimentDigest, describe, explain
from hermes.store import ExperimentRecord, ExperimentStatus, NameTaken, StoreError, TooManyExperiments
from hermes.store.base import DamagedRecord
from hermes.store.codec import to_dict

_bearer = HTTPBearer(auto_error=False, description="a token from `hermes server add-user` or `add-token`")
LOG_TAIL = 64 * 1024  # bytes of a log sent at most per request
PAGE_MAX = 10_000  # trials or runs per page
RECENT_EXPERIMENTS = 50  # ended experiments whose runs the pool's timeline still shows: its recent past, bounded
STORE_INT_MAX = 2**31 - 1  # PostgreSQL's integer columns hold 32 bits: no id or cursor lies above, none is asked for
MAX_DEPTH = 64  # arrays and objects a request body nests at most: a spec nests a few; Python's parser stops near 1000
_JSON_TOKENS = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)  # an escaped character, a quote or a bracket
_NESTING = {b"[": 1, b"{": 1, b"]": -1, b"}": -1}

Cursor = Annotated[int, Query(ge=0, le=STORE_INT_MAX)]  # what an answer gave to ask from next; 0: from the start


class _Route(APIRoute):
    """A route that refuses a JSON body nested past ``MAX_DEPTH`` with 422 before it is parsed: Python's parser,
    a 422 that echoes the input and the checks of a spec all recurse, so one nested some hundred levels deep
    would exhaust the stack (a 500, or FastAPI's 400 for a body it cannot parse). A query parameter that holds a
    NUL is refused with 422 naming it: no name or id holds one, and PostgreSQL refuses one even in a query (a 500,
    where SQLite found nothing). Both after the token is checked (``_caller``): they answered a request with none 422,
    not 401, and read its body first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            # the token first: a request without a valid one is answered 401, its body never read nor scanned
            request.state.user = await run_in_threadpool(_caller, request, await _bearer(request))
            try:
                body = await request.body()
            except ClientDisconnect:  # gone, or refused by BodyLimit, which answered 413: no one to answer
                return Response()
            if _nesting(body) > MAX_DEPTH:
                raise RequestValidationError([{"type": "too_deep", "loc": ("body",), "input": None,
                                               "msg": f"nests arrays and objects deeper than {MAX_DEPTH} levels"}])
            holding_nul = [name for name, value in request.query_params.multi_items() if "\0" in value]
            if holding_nul:
                raise RequestValidationError([{"type": "nul", "loc": ("query", name), "input": None,
                                               "msg": "must not hold a NUL character"} for name in holding_nul])
            return await handler(request)

        return handle


def _nesting(body: bytes) -> int:
    """How deep a JSON text nests arrays and objects (brackets inside its strings left out), read without
    parsing it (parsing recurses), in one pass: a pattern of whole strings was tried again from each quote of
    an unended one, so a body of escaped quotes took time in its square (64 KiB: 15 s, every request waiting)."""
    depth = deepest = 0
    in_string = False
    for token in _JSON_TOKENS.findall(body):
        if token == b'"':
            in_string = not in_string
        elif not in_string and token in _NESTING:
            depth += _NESTING[token]
            deepest = max(deepest, depth)
    return deepest


router = APIRouter(route_class=_Route)


def _hermes(request: Request) -> Hermes:
    return request.app.state.hermes


def _caller(request: Request, credentials: HTTPAuthorizationCredentials | None) -> User:
    """The user whose token the request carries; 401 for none or an unknown one."""
    user = None if credentials is None else _hermes(request).accounts.user_for(credentials.credentials)
    if user is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a valid token is needed: send the header 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return user


def _user(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> User:
    """The caller, whom ``_Route`` found before reading the body (one look-up in the database per request);
    ``credentials`` declares the bearer scheme in the OpenAPI schema, for /docs."""
    return request.state.user


HermesDep = Annotated[Hermes, Depends(_hermes)]
UserDep = Annotated[User, Depends(_user)]


def _experiment(hermes: Hermes, user: User, experiment_id: int) -> ExperimentRecord:
    """The experiment, if the user may see it; else 404, exactly as for a missing one (an id no store
    holds, too large for its column, is one), so that an answer never tells another user's apart."""
    try:
        experiment = hermes.store.experiment(experiment_id) if 0 < experiment_id <= STORE_INT_MAX else None
    except DamagedRecord:
        if user.admin:  # its owner cannot be told apart from others when its row is damaged: the admin is told
            raise
        experiment = None
    except StoreError:
        experiment = None
    if experiment is None or not user.may_see(experiment.owner):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no experiment {experiment_id}")
    return experiment


def _digest(hermes: Hermes, user: User, experiment_id: int) -> tuple[ExperimentRecord, ExperimentDigest]:
    experiment = _experiment(hermes, user, experiment_id)
    return experiment, hermes.digest(experiment)


def _now(hermes: Hermes, experiment: ExperimentRecord, digest: ExperimentDigest) -> float:
    """The time on the experiment's clock now, where its running bars end. An experiment the pool runs is on the
    pool's clock, which goes on between its events: its runs grow while they last. Any other has no clock that
    goes on here: its last event's time."""
    executor = hermes.pool.executor
    if experiment.owner is None or experiment.status is not ExperimentStatus.RUNNING or executor is None:
        return digest.now
    if hermes.pool_stopped() is not None:  # its runs ended with the pool, which could not record so
        return digest.now
    return max(digest.now, executor.now())


# ---------------------------------------------------------------------- models
class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] = Field(description="the experiment spec, as its YAML file would hold it")
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False, strict=True,  # true is no 1
                          description="share of the GPU pool against others")
    folder: str = Field("", max_length=4096, description="where the spec's file lies in your area, relative to it: "
                                                         "the spec's relative paths start there (default: the area)")


class WeightRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight: float = Field(ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False, strict=True)  # "2.5" and true: 422


class Experiment(BaseModel):
    id: int
    name: str
    owner: str | None
    status: str
    weight: float
    cancel_requested: bool
    error: str | None = None  # why it failed
    created_at: float
    metric: str
    mode: str
    trials: int | None = None  # in the list and detail
    best: float | None = None
    best_trial: str | None = None
    by_state: dict[str, int] = {}
    spec: dict[str, Any] | None = None  # in the detail only
    damaged: str | None = None  # a damaged record of it, and what to do: its trials and best are then left out


def _summary(experiment: ExperimentRecord, spec: bool = False, pool_stopped: str | None = None) -> Experiment:
    """With ``pool_stopped`` (``Hermes.pool_stopped``), an experiment the pool ran is shown interrupted, saying why:
    the pool could not record that, so its record still says running; or it could (its Ray cluster lost, the store
    fine), and the record says interrupted with no reason of its own."""
    metric = experiment.spec.get("metric", {})
    status, error = experiment.status.value, experiment.error
    stopped = experiment.status is ExperimentStatus.RUNNING or (
        experiment.status is ExperimentStatus.INTERRUPTED and experiment.error is None)
    if pool_stopped is not None and experiment.owner is not None and stopped:
        status, error = ExperimentStatus.INTERRUPTED.value, pool_stopped
    return Experiment(
        id=experiment.experiment_id, name=experiment.name, owner=experiment.owner, status=status,
        weight=experiment.weight, cancel_requested=experiment.cancel_requested, error=error,
        created_at=experiment.created_at,
        metric=str(metric.get("name", "")), mode=str(metric.get("mode", "")),
        spec=experiment.spec if spec else None,
    )


# ---------------------------------------------------------------------- experiments
@router.get("/me", summary="who the token belongs to")
def me(user: UserDep) -> dict[str, Any]:
    return {"name": user.name, "admin": user.admin}


@router.post("/experiments", status_code=status.HTTP_201_CREATED, summary="submit an experiment spec")
def submit(body: SubmitRequest, hermes: HermesDep, user: UserDep) -> Experiment:
    try:
        spec = hermes.parse(body.spec, user.name, body.folder)
    except SpecError as error:
        detail = [{"loc": ["body", *(["folder"] if path == "folder" else ["spec", *path.split(".")])], "msg": message,
                   "type": "spec"}
                  for path, message in error.problems] or [{"loc": ["body", "spec"], "msg": str(error), "type": "spec"}]
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail) from None
    try:
        experiment_id = hermes.store.submit_experiment(spec.name, hermes.stored(spec), user.name, body.weight,
                                                       max_active=hermes.config.max_active)
    except TooManyExperiments:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS, f"you have {hermes.config.max_active} experiments queued, running or "
            "interrupted, the most this server takes from one user (`hermes server --max-experiments`): submit this "
            "one when one of them has ended, or cancel one"
        ) from None
    except NameTaken:  # its message names the database, which is not the caller's business
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"you have an experiment named {spec.name!r} already; give this one another name "
            "(`hermes submit --name NAME` leaves the spec as it is)"
        ) from None
    # any other StoreError is the store's: 503 or 507 (StoreUnavailable, StoreFull), else a 500 (app.py); a lost
    # connection and a taken name were both a plain StoreError, and both answered 409
    return _summary(hermes.store.experiment(experiment_id), spec=True)


def _overviewed(
    hermes: Hermes, experiment: ExperimentRecord, overview: Callable[[ExperimentRecord], dict[str, Any]],
    spec: bool = False,
) -> Experiment:
    """The experiment with its trials and best; where a record of it is damaged, ``damaged`` naming it instead. One
    damaged experiment failed the whole list, for every user (and ``hermes status --server``, which reads each
    one's spec here), and a cancel or a weight change made to it was answered with a 500, as if it had failed."""
    try:
        shown = overview(experiment)
    except DamagedRecord as error:
        shown = {"damaged": damage_detail(error)}
    return _summary(experiment, spec, hermes.pool_stopped()).model_copy(update=shown)


@router.get("/experiments", summary="the experiments you may see, oldest first")
def experiments(hermes: HermesDep, user: UserDep) -> list[Experiment]:
    return [
        _overviewed(hermes, experiment, hermes.overview)
        for experiment in hermes.store.experiments()
        if user.may_see(experiment.owner)
    ]


@router.get("/experiments/{experiment_id}", summary="one experiment, with its spec")
def experiment(experiment_id: int, hermes: HermesDep, user: UserDep) -> Experiment:
    record = _experiment(hermes, user, experiment_id)
    return _overviewed(hermes, record, lambda record: hermes.digest(record).overview(), spec=True)


@router.post("/experiments/{experiment_id}/cancel", status_code=status.HTTP_202_ACCEPTED,
             summary="stop the experiment's trials and end it")
def cancel(experiment_id: int, hermes: HermesDep, user: UserDep) -> Experiment:
    _changeable(_experiment(hermes, user, experiment_id), "stop that `hermes run` process to cancel it")
    hermes.store.request_cancel(experiment_id)  # the pool stops its trials, or never starts it
    return _current(hermes, experiment_id)


@router.put("/experiments/{experiment_id}/weight", summary="change the experiment's share of the GPU pool")
def set_weight(experiment_id: int, body: WeightRequest, hermes: HermesDep, user: UserDep) -> Experiment:
    _changeable(_experiment(hermes, user, experiment_id), "it has no share of the pool to change")
    hermes.store.set_weight(experiment_id, body.weight)
    return _current(hermes, experiment_id)


def _changeable(record: ExperimentRecord, instead: str) -> None:
    """409 for an experiment that a cancel or a weight would never reach: one that ended (it ran with the weight it
    has: a new one would misstate its share), or one that `hermes run` runs in this store, which the pool never takes
    up (the cancel was accepted, and the run finished anyway; an interrupted one kept it asked for ever)."""
    if record.status.is_final:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"experiment {record.experiment_id} is {record.status.value} already")
    if record.owner is None:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            f"experiment {record.experiment_id} ({record.name}) is run by `hermes run` in this "
                            f"server's store, not by the server's pool: {instead}")


def _current(hermes: Hermes, experiment_id: int) -> Experiment:
    """The experiment as ``GET`` gives it, less its spec: what a change left it (its trials and best too)."""
    record = hermes.store.experiment(experiment_id)
    return _overviewed(hermes, record, lambda record: hermes.digest(record).overview())


# ---------------------------------------------------------------------- what an experiment recorded
@router.get("/experiments/{experiment_id}/trials", summary="trial records with their best and last value")
def trials(
    experiment_id: int, hermes: HermesDep, user: UserDep,
    since: Annotated[Cursor, Query(description="only trials changed after this version")] = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_MAX,
) -> dict[str, Any]:
    record, digest = _digest(hermes, user, experiment_id)
    found, version = digest.trials_since(since, limit)
    return {"version": version, "more": version < digest.version, "now": _now(hermes, record, digest), "trials": found}


@router.get("/experiments/{experiment_id}/trials/{trial_id}", summary="one trial")
def trial(experiment_id: int, trial_id: str, hermes: HermesDep, user: UserDep) -> dict[str, Any]:
    _, digest = _digest(hermes, user, experiment_id)
    found = digest.trial(trial_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial {trial_id!r} in experiment {experiment_id}")
    return found


@router.get("/experiments/{experiment_id}/metrics", summary="every report, in the order recorded")
def metrics(
    experiment_id: int, hermes: HermesDep, user: UserDep,
    after: Annotated[Cursor, Query(description="the cursor of the last report you have")] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
    trial: Annotated[str | None, Query(description="only this trial's reports (the cursor: its last one's)")] = None,
) -> dict[str, Any]:
    _experiment(hermes, user, experiment_id)
    reports = hermes.store.metrics_after(experiment_id, after, limit, trial_id=trial)
    rows = [
        {"cursor": cursor, "trial": r.trial_id, "step": r.step, "at": r.at,
         "values": {k: v if math.isfinite(v) else str(v) for k, v in r.values.items()}}
        for cursor, r in reports
    ]
    return {"cursor": reports[-1][0] if reports else after, "metrics": rows}


@router.get("/experiments/{experiment_id}/curves", summary="the objective per report, as columns (for charts)")
def curves(
    experiment_id: int, hermes: HermesDep, user: UserDep,
    after: Cursor = 0,
    limit: Annotated[int, Query(ge=1, le=200_000)] = 50_000,
) -> dict[str, Any]:
    _, digest = _digest(hermes, user, experiment_id)
    reports = hermes.store.metrics_after(experiment_id, after, limit)
    columns: dict[str, list[Any]] = {"trial": [], "step": [], "at": [], "value": []}
    for _cursor, report in reports:
        value = digest.target.value(report.values)
        columns["trial"].append(report.trial_id)
        columns["step"].append(report.step)
        columns["at"].append(report.at)
        columns["value"].append(value if value is not None and math.isfinite(value) else None)
    return {"cursor": reports[-1][0] if reports else after, "more": len(reports) == limit, **columns}


@router.get("/experiments/{experiment_id}/events", summary="the event log, from sequence number after+1")
def events(
    experiment_id: int, hermes: HermesDep, user: UserDep,
    after: Cursor = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> dict[str, Any]:
    pooled = _experiment(hermes, user, experiment_id).owner is not None
    found = hermes.store.events_after(experiment_id, after, limit)
    silent = _silent_exits(hermes, experiment_id, found)
    rows = [
        {"seq": seq, **_json_safe(to_dict(event)), "description": describe(event, pooled, reported=seq not in silent)}
        for seq, event in found
    ]
    return {"cursor": found[-1][0] if found else after, "events": rows}


@router.get("/experiments/{experiment_id}/decisions", summary="scheduling decisions with their reasons")
def decisions(
    experiment_id: int, hermes: HermesDep, user: UserDep,
    after: Annotated[Cursor, Query(description="decisions of events after this sequence number")] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000, description="events to cover")] = 10_000,
) -> dict[str, Any]:
    pooled = _experiment(hermes, user, experiment_id).owner is not None
    found = hermes.store.events_after(experiment_id, after, limit)
    if not found:
        return {"cursor": after, "decisions": []}
    causes = dict(found)
    silent = _silent_exits(hermes, experiment_id, found)
    rows = [
        {"seq": record.event_seq, "at": record.at, **_json_safe(to_dict(record.decision)),
         "reason": explain(causes[record.event_seq], record.decision, pooled, reported=record.event_seq not in silent)}
        for record in hermes.store.decisions_after(experiment_id, after, found[-1][0])
    ]
    return {"cursor": found[-1][0], "decisions": rows}


def _silent_exits(hermes: Hermes, experiment_id: int, events: list[tuple[int, Event]]) -> set[int]:
    """The sequence numbers of the exits among ``events`` that succeeded though their trial never reported, which the
    core fails (``NO_REPORT``). A report of the trial earlier in the page says it reported; else its first report in
    the store, asked for by the trial (an index): the page need not hold the reports of a trial that it sees exit.
    Mostly its last report is just before its exit, so a page asks for few."""
    reported: set[str] = set()
    silent: set[int] = set()
    for seq, event in events:
        if isinstance(event, TrialReported):
            reported.add(event.trial_id)
        elif isinstance(event, TrialExited) and event.succeeded and event.trial_id not in reported:
            if hermes.store.metrics_after(experiment_id, 0, 1, trial_id=event.trial_id):
                reported.add(event.trial_id)
            else:
                silent.add(seq)
    return silent


@router.get("/experiments/{experiment_id}/timeline", summary="the GPU timeline: runs changed after a version")
def timeline(
    experiment_id: int, hermes: HermesDep, user: UserDep,
    since: Cursor = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_MAX,
) -> dict[str, Any]:
    record, digest = _digest(hermes, user, experiment_id)
    found, version = digest.runs_since(since, limit)
    return {"version": version, "more": version < digest.version, "now": _now(hermes, record, digest),
            "gpus": list(digest.gpus), "runs": found}


@router.get("/experiments/{experiment_id}/trials/{trial_id}/log", summary="a trial's output, from a byte offset")
def trial_log(
    experiment_id: int, trial_id: str, hermes: HermesDep, user: UserDep,
    stream: Literal["stdout", "stderr"] = "stdout",
    offset: Annotated[int | None, Query(ge=0, description="default: the last 64 KiB")] = None,
) -> dict[str, Any]:
    record, digest = _digest(hermes, user, experiment_id)
    if digest.trial(trial_id) is None:  # only known ids make a path: no ../ can reach outside the experiment
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no trial {trial_id!r} in experiment {experiment_id}")
    directory = hermes.experiment_dir(record)
    none = HTTPException(status.HTTP_404_NOT_FOUND, f"trial {trial_id!r} has no {stream} log to show")
    if directory is None:
        raise none
    try:
        size, start, chunk = _log_chunk(directory / "trials" / trial_id / f"{stream}.log", offset)
    except OSError:  # a link, a loop, no permission, no regular file: never a 500
        raise none from None
    # Whole characters only: a chunk skips what is left of a character begun before it (a tail starts anywhere),
    # and ends before a character it would cut, which the next chunk starts with; an invalid byte shows as U+FFFD.
    head = chunk[:3]
    lead = len(head) - len(head.lstrip(bytes(range(0x80, 0xC0))))
    cut = re.search(rb"(?:[\xc0-\xdf]|[\xe0-\xef][\x80-\xbf]?|[\xf0-\xf7][\x80-\xbf]{0,2})\Z", chunk)
    end = len(chunk) if cut is None else cut.start()
    return {"offset": start + end, "size": size, "text": chunk[lead:end].decode("utf-8", errors="replace")}


def _log_chunk(path: Path, offset: int | None) -> tuple[int, int, bytes]:
    """The log's size, where its chunk starts (``offset``; None: the last ``LOG_TAIL`` bytes) and the chunk, all read
    from one descriptor: opened once, with no link in its last part, and checked to be the file at ``path`` (no link
    on the way either). Checking the path, then opening it by name again, opened whatever a link swapped in between
    led to: another user's log, /etc/passwd. A missing log is empty; OSError for one that is refused."""
    try:
        fd = open_regular(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return 0, 0, b""
    with os.fdopen(fd, "rb") as file:
        if os.readlink(f"/proc/self/fd/{fd}") != str(path):
            raise OSError(errno.EXDEV, "leads out of its trial's directory", str(path))
        size = file.seek(0, os.SEEK_END)
        start = max(size - LOG_TAIL, 0) if offset is None else min(offset, size)
        file.seek(start)
        return size, start, file.read(min(size - start, LOG_TAIL))


# ---------------------------------------------------------------------- users
class UserWeight(BaseModel):
    user: str
    admin: bool
    weight: float  # the user's weight in the pool's fair share: the pool is split between users first


def _user_weights(hermes: Hermes, caller: User) -> list[UserWeight]:
    weights = hermes.store.owner_weights()
    return [UserWeight(user=one.name, admin=one.admin, weight=weights.get(one.name, 1.0))
            for one in hermes.accounts.users() if caller.admin or one.name == caller.name]


@router.get("/users", summary="users and their weights in the fair share (yourself only, unless you are an admin)")
def users(hermes: HermesDep, user: UserDep) -> list[UserWeight]:
    return _user_weights(hermes, user)


@router.put("/users/{name}/weight", summary="change a user's weight in the fair share (admins only)",
            responses={403: {"description": "the caller is no admin"}, 404: {"description": "no such user"}})
def set_user_weight(name: str, body: WeightRequest, hermes: HermesDep, user: UserDep) -> UserWeight:
    if not user.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "only an admin may change a user's weight")
    if name not in {one.name for one in hermes.accounts.users()}:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no user {name!r}")
    hermes.store.set_owner_weight(name, body.weight)  # the pool takes it up at its next look at the store
    return next(one for one in _user_weights(hermes, user) if one.user == name)


# ---------------------------------------------------------------------- the cluster
@router.get("/cluster", summary="GPU use per user against their fair share, over the experiments running now")
def cluster(hermes: HermesDep, user: UserDep) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    owner_weights = hermes.store.owner_weights()
    stopped = hermes.pool_stopped()
    for share in hermes.pool.shares() if stopped is None else ():  # a stopped pool's last shares hold no GPU
        owner = share.owner if user.admin or share.owner == user.name else "(other users)"
        weight = owner_weights.get(owner, 1.0) if owner == share.owner else None  # others' are not summed
        row = rows.setdefault(owner, {"user": owner, "weight": weight, "experiments": 0, "gpus_now": 0, "share": 0.0,
                                      "gpu_seconds": 0.0, "owed_gpu_seconds": 0.0})
        row["experiments"] += 1
        row["gpus_now"] += share.gpus
        row["share"] += share.share
        row["gpu_seconds"] += share.used_gpu_seconds
        row["owed_gpu_seconds"] += share.owed_gpu_seconds
    return {"gpus": hermes.pool.gpus(), "users": sorted(rows.values(), key=lambda row: row["user"]),
            "pool_stopped": stopped}


@router.get("/cluster/timeline", summary="the pool's GPU timeline: every experiment's runs changed after a cursor")
def cluster_timeline(
    hermes: HermesDep, user: UserDep,
    since: Annotated[str, Query(max_length=100_000, pattern=r"^(\d{1,19}:\d{1,19}(,\d{1,19}:\d{1,19})*)?$",
                                description="the cursor the last answer gave (empty: from the start)")] = "",
    limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = PAGE_MAX,
) -> dict[str, Any]:
    """Who ran where on the pool's GPUs, when, and why: the runs of its open experiments and of the
    ``RECENT_EXPERIMENTS`` last to end, on the pool's one clock. Another user's runs come without their
    experiment, trial or reasons (owner ``(other users)``), as in ``/cluster``. The cursor holds each
    experiment's timeline version; ``more`` says that a page ended before everything changed was sent. An
    experiment with a damaged record is left out, its cursor kept, rather than failing the timeline of all; those
    the caller may see are listed in ``damaged`` (their own routes name the record)."""
    pairs = [tuple(map(int, pair.split(":"))) for pair in since.split(",")] if since else []
    past = next((number for pair in pairs for number in pair if number > STORE_INT_MAX), None)
    if past is not None:  # as the experiments' cursors are (``Cursor``): no answer gave it
        raise RequestValidationError([{"type": "less_than_equal", "loc": ("query", "since"), "input": since,
                                       "msg": f"holds {past}, past {STORE_INT_MAX}, the largest id or version a "
                                              "store holds"}])
    seen = dict(pairs)
    pooled = [record for record in hermes.store.experiments() if record.owner is not None]
    ended = sorted((r for r in pooled if r.status.is_final), key=lambda r: r.experiment_id)[-RECENT_EXPERIMENTS:]
    shown = sorted([r for r in pooled if not r.status.is_final] + ended, key=lambda r: r.experiment_id)
    runs: list[dict[str, Any]] = []
    cursor, gpus, now, more, damaged = {}, {}, 0.0, False, []
    for record in shown:
        after = seen.get(record.experiment_id, 0)
        try:
            digest = hermes.digest(record)
        except DamagedRecord:
            cursor[record.experiment_id] = after
            if user.may_see(record.owner):
                damaged.append(record.experiment_id)
            continue
        found, version = digest.runs_since(after, limit - len(runs)) if len(runs) < limit else ([], after)
        more = more or version < digest.version
        cursor[record.experiment_id] = version
        gpus.update(dict.fromkeys(digest.gpus))
        now = max(now, _now(hermes, record, digest))
        visible = user.may_see(record.owner)
        runs += [_cluster_run(record, run, visible) for run in found]
    return {"cursor": ",".join(f"{key}:{value}" for key, value in cursor.items()), "more": more, "now": now,
            "gpus": list(gpus), "runs": runs, "damaged": damaged}


def _cluster_run(record: ExperimentRecord, run: dict[str, Any], visible: bool) -> dict[str, Any]:
    """A run of the pool's timeline, keyed by its experiment and its index there; another user's, anonymous."""
    key = f"{record.experiment_id}.{run['index']}"
    if visible:
        return {**run, "key": key, "experiment": record.experiment_id, "name": record.name, "owner": record.owner}
    kept = ("gpu", "started_at", "ended_at", "ended_by", "resumed", "migrated", "yield_requested_at")
    return {"key": key, "experiment": None, "name": None, "owner": "(other users)", "trial": None,
            **{field: run[field] for field in kept}}


def _json_safe(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v if not isinstance(v, float) or math.isfinite(v) else str(v) for k, v in data.items()}
