"""A Hermes server seen from the command line: submit a spec, and read an experiment as a read-only store.

``RemoteStore`` answers the store's read methods from the REST API, so ``hermes status``,
``results`` and ``plot`` run their own code unchanged against a server. It needs nothing beyond
the standard library, so a laptop that only submits needs neither FastAPI nor a database driver.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from hermes.core.decisions import Decision
from hermes.core.events import Event
from hermes.core.states import TrialState
from hermes.errors import HermesError
from hermes.store import (
    DecisionRecord,
    ExperimentRecord,
    ExperimentStatus,
    ExperimentStore,
    MetricRecord,
    StoreError,
    TrialRecord,
)
from hermes.store.codec import from_dict

TOKEN_VARIABLE = "HERMES_TOKEN"
PAGE = 10_000


class ServerError(HermesError):
    """The server refused a request or could not be reached; the message says what it answered."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib sent the token on to wherever one led, another host too (a proxy's login page)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None  # the 3xx comes back as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirects)


class Client:
    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = _server_url(url)
        self.token = token or os.environ.get(TOKEN_VARIABLE)
        if not self.token:
            raise ServerError(f"a token is needed for {self.url}: pass --token or set {TOKEN_VARIABLE}")

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        request = urllib.request.Request(
            f"{self.url}/api{path}{'?' + query if query else ''}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with _OPENER.open(request, timeout=60) as response:
                answer = response.read()
                kind = response.headers.get_content_type()
        except urllib.error.HTTPError as error:
            if 300 <= error.code < 400:
                where = urllib.parse.urljoin(request.full_url, error.headers.get("Location", ""))
                raise ServerError(f"the server URL {self.url} redirects to {where}; give the URL of the Hermes server "
                                  "itself (a redirect is not followed, so that the token goes nowhere else)") from None
            detail = _detail(error)
            raise ServerError(f"{self.url}: {error.code} {error.reason}{': ' + detail if detail else ''}") from None
        except urllib.error.URLError as error:
            raise ServerError(f"cannot reach {self.url}: {error.reason}") from None
        except (OSError, http.client.HTTPException, ValueError) as error:
            # A timeout while reading, a port that speaks no HTTP, a URL that urllib cannot use after all.
            raise ServerError(f"cannot reach {self.url}: {error or type(error).__name__}") from None
        try:
            return json.loads(answer)
        except ValueError:  # an HTML page, say: another web server at that address, or a proxy's login page
            raise ServerError(f"{self.url} did not answer as a Hermes server ({kind}, not JSON); is the URL the "
                              "one `hermes server` listens on?") from None

    def submit(self, spec: Mapping[str, Any], weight: float = 1.0, folder: str = "") -> dict[str, Any]:
        """``folder``: where the spec's file lies in the user's area on the server (its relative paths start there)."""
        return self.request("POST", "/experiments", {"spec": dict(spec), "weight": weight, "folder": folder})

    def cancel(self, name: str) -> dict[str, Any]:
        """Ask the server to stop the experiment called ``name`` (one the token's user may see; an
        admin who sees several of that name gives ``owner/name``) and end it."""
        from hermes.report import named

        seen = [RemoteStore.record(summary, {}) for summary in self.request("GET", "/experiments")]
        return self.request("POST", f"/experiments/{named(seen, name, self.url).experiment_id}/cancel")


class RemoteStore(ExperimentStore):
    """The experiments a server shows this token's user, read-only."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.url = client.url

    def experiments(
        self, status: ExperimentStatus | Collection[ExperimentStatus] | None = None
    ) -> list[ExperimentRecord]:
        wanted = None if status is None else {
            ExperimentStatus(one) for one in ([status] if isinstance(status, str) else status)
        }
        return [self.record(e, self.client.request("GET", f"/experiments/{e['id']}")["spec"])
                for e in self.client.request("GET", "/experiments")
                if wanted is None or ExperimentStatus(e["status"]) in wanted]

    def experiment(self, experiment_id: int) -> ExperimentRecord:
        found = self.client.request("GET", f"/experiments/{experiment_id}")
        return self.record(found, found["spec"])

    def trials(self, experiment_id: int) -> list[TrialRecord]:
        """Every page: the server sends at most ``PAGE_MAX`` trials at once (the first 10,000 were all that
        ``hermes status --server`` saw). A trial that changed while the pages were read comes again: its last record
        is kept."""
        found: dict[str, TrialRecord] = {}
        version = 0
        while True:
            page = self.client.request("GET", f"/experiments/{experiment_id}/trials", since=version, limit=PAGE)
            for t in page["trials"]:
                found[t["trial"]] = TrialRecord(
                    trial_id=t["trial"], params=t["params"], state=TrialState(t["state"]), budget=t["budget"],
                    submitted_at=t["submitted_at"] or 0.0, step=t["step"], checkpoint_step=t.get("checkpoint_step", 0),
                    gpu=t["gpu"], error=t["error"], started_at=t["started_at"], ended_at=t["ended_at"],
                )
            if not page["more"]:
                return list(found.values())
            version = page["version"]

    def metrics(self, experiment_id: int, trial_id: str | None = None) -> list[MetricRecord]:
        return [report for _cursor, report in self.metrics_after(experiment_id, 0, trial_id=trial_id)]

    def events(self, experiment_id: int) -> list[Event]:
        return [event for _seq, event in self.events_after(experiment_id, 0)]

    def events_after(self, experiment_id: int, after: int, limit: int | None = None) -> list[tuple[int, Event]]:
        found: list[tuple[int, Event]] = []
        while limit is None or len(found) < limit:
            page = self.client.request("GET", f"/experiments/{experiment_id}/events", after=after, limit=PAGE)
            for row in page["events"]:
                row.pop("description")
                seq = row.pop("seq")
                found.append((seq, from_dict({k: _number(v) for k, v in row.items()})))  # type: ignore[arg-type]
            if page["cursor"] == after:
                break
            after = page["cursor"]
        return found[:limit] if limit is not None else found

    def decisions(self, experiment_id: int) -> list[DecisionRecord]:
        return self.decisions_after(experiment_id, 0)

    def decisions_after(self, experiment_id: int, after: int, upto: int | None = None) -> list[DecisionRecord]:
        found: list[DecisionRecord] = []
        while True:
            page = self.client.request("GET", f"/experiments/{experiment_id}/decisions", after=after, limit=PAGE)
            for row in page["decisions"]:
                seq, at = row.pop("seq"), row.pop("at")
                row.pop("reason")
                if upto is None or seq <= upto:
                    found.append(DecisionRecord(seq, at, from_dict(row)))  # type: ignore[arg-type]
            if page["cursor"] == after or (upto is not None and page["cursor"] >= upto):
                return found
            after = page["cursor"]

    def metrics_after(
        self, experiment_id: int, after: int, limit: int | None = None, trial_id: str | None = None,
    ) -> list[tuple[int, MetricRecord]]:
        """A page at a time until ``limit``; without one, until the last report (one page was all it gave)."""
        found: list[tuple[int, MetricRecord]] = []
        while limit is None or len(found) < limit:
            wanted = PAGE if limit is None else min(PAGE, limit - len(found))
            page = self.client.request("GET", f"/experiments/{experiment_id}/metrics", after=after, limit=wanted,
                                       trial=trial_id)
            found += [(m["cursor"], _metric(m)) for m in page["metrics"]]
            if page["cursor"] == after:
                break
            after = page["cursor"]
        return found

    def close(self) -> None:
        pass

    @staticmethod
    def record(summary: Mapping[str, Any], spec: dict[str, Any]) -> ExperimentRecord:
        """The record of an experiment's summary in the API (``GET /experiments``) and its spec."""
        return ExperimentRecord(
            summary["id"], summary["name"], spec, summary["created_at"], ExperimentStatus(summary["status"]),
            owner=summary["owner"], weight=summary["weight"], cancel_requested=summary["cancel_requested"],
            error=summary.get("error"),
        )

    # ------------------------------------------------------------------ writes go through the API, not here
    def create_or_open_experiment(self, name: str, spec: Mapping[str, Any], may_change: Collection[str] = ()) -> int:
        raise self._read_only()

    def set_status(self, experiment_id: int, status: ExperimentStatus, error: str | None = None) -> None:
        raise self._read_only()

    def claim_writer(self, experiment_id: int, holder: str) -> None:
        raise self._read_only()

    def record_events(
        self, experiment_id: int, records: Sequence[tuple[Event, Sequence[Decision], Sequence[TrialRecord]]]
    ) -> list[int]:
        raise self._read_only()

    def save_accounts(self, accounts: Mapping[int, tuple[float, float]]) -> None:
        raise self._read_only()

    def set_owner_weight(self, owner: str, weight: float) -> None:
        raise self._read_only()

    def owner_weights(self) -> dict[str, float]:
        raise self._read_only()

    def append_event(self, experiment_id: int, event: Event, decisions: Sequence[Decision] = ()) -> int:
        raise self._read_only()

    def upsert_trial(self, experiment_id: int, trial: TrialRecord) -> None:
        raise self._read_only()

    def record_metrics(
        self, experiment_id: int, trial_id: str, step: int, at: float, metrics: Mapping[str, float]
    ) -> None:
        raise self._read_only()

    def submit_experiment(self, name: str, spec: Mapping[str, Any], owner: str = "", weight: float = 1.0,
                          max_active: int | None = None) -> int:
        raise self._read_only()

    def set_weight(self, experiment_id: int, weight: float) -> None:
        raise self._read_only()

    def request_cancel(self, experiment_id: int) -> None:
        raise self._read_only()

    def latest_event_at(self) -> float:
        """Over the experiments this token's user sees."""
        return max((float(self.client.request("GET", f"/experiments/{e['id']}/timeline", limit=1)["now"])
                    for e in self.client.request("GET", "/experiments")), default=0.0)

    def _read_only(self) -> StoreError:
        return StoreError(f"{self.url} is read here; submit, cancel and weights go through the API")


def _server_url(url: str) -> str:
    """``url`` without its trailing slash, ``http://`` put before one without a scheme (``gpu-box:8600``, as
    Determined's ``-m``); a ServerError naming a URL that urllib could not use, rather than its ValueError."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # a ValueError where it is no number, or out of range
    except ValueError as error:
        raise ServerError(f"server URL {url!r} cannot be used: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise ServerError(f"server URL {url!r} cannot be used: give http://HOST[:PORT] or https://HOST[:PORT]")
    return url.rstrip("/")


def _metric(row: Mapping[str, Any]) -> MetricRecord:
    return MetricRecord(row["trial"], row["step"], row["at"], {k: float(v) for k, v in row["values"].items()})


def _number(value: Any) -> Any:
    """The API sends non-finite floats as the strings Python's float() reads."""
    return float(value) if value in ("nan", "inf", "-inf") else value


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(error.read()).get("detail")
    except (ValueError, AttributeError):
        return ""
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])[1:]))}: {d.get('msg')}" for d in detail)
    return str(detail)
