"""The dashboard in Chromium against a real `hermes server`, on what its polls used to undo or choke on: a weight
being typed in a running experiment's header or in the cluster's Users table (both polled, neither wiped), learning
curves whose steps count iterations in millions (drawn at the steps reported, labelled 1.2M), and a token revoked
while a page polls (the sign-in form says so, the console logs no error)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (test extra)")

from test_dashboard import (  # noqa: E402, F401 (fixtures: a browser, and one server for the module)
    CHROMIUM, browser, chromium, cluster_view, server, shared_server, signed_in, submit,
)
from test_server import add_user, real_spec  # noqa: E402

from hermes.server.app import ServerConfig  # noqa: E402
from hermes.server.auth import Accounts  # noqa: E402

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM}")

# A trial that counts its steps in iterations: a report every ``every`` of them, up to the budget, at once.
ITERATIONS = '''
from hermes import trial


def train(config):
    every = config["every"]
    for k in range(1, trial.budget() // every + 1):
        trial.report(k * every, loss=1.0 / (k * config["rate"]))
'''


def api(url: str, token: str, method: str, path: str, body: object = None) -> Any:
    import httpx

    response = httpx.request(method, f"{url}/api{path}", json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def updates_after(page: Any, polls: int) -> None:
    """Wait until the experiment's view drew ``polls`` more polls."""
    seen = page.evaluate("() => window.hermesDashboard.updates || 0")
    page.wait_for_function(f"() => (window.hermesDashboard.updates || 0) >= {seen + polls}", timeout=15_000)


def test_a_weight_being_typed_in_the_header_survives_the_polls(server: tuple[str, str, str], browser: Any) -> None:
    """Its trials change state and best at every poll, and the header says so in place: the weight typed meanwhile
    keeps its value and the focus, and "Set weight" sends it. A weight changed elsewhere shows once not edited."""
    url, token, _ = server
    experiment_id = submit(url, token, real_spec("typed", trials=6, steps=400, sleep=0.1))  # cancelled after
    errors: list[str] = []
    page = signed_in(browser, url, token, errors)
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_selector("input#weight")
    page.wait_for_function("() => window.hermesDashboard.state.experiment?.best !== null", timeout=30_000)
    page.fill("#weight", "4")
    summary = page.inner_text("#view .controls span")
    updates_after(page, 1)
    page.wait_for_function(f"() => document.querySelector('#view .controls span').innerText !== {summary!r}")
    assert page.input_value("#weight") == "4"
    assert page.evaluate("() => document.activeElement.id") == "weight"
    page.click("#view .controls button:has-text('Set weight')")
    page.wait_for_function("() => window.hermesDashboard.state.experiment.weight === 4", timeout=10_000)
    assert api(url, token, "GET", f"/experiments/{experiment_id}")["weight"] == 4
    assert page.inner_text("#control-error") == ""

    api(url, token, "PUT", f"/experiments/{experiment_id}/weight", {"weight": 2.5})  # as from another tab
    page.wait_for_function("() => document.querySelector('input#weight').value === '2.5'", timeout=10_000)
    assert errors == []


def test_curves_of_steps_counted_in_millions_draw_the_steps_reported(
    shared_server: tuple[str, str, str, Path], server: tuple[str, str, str], browser: Any,
) -> None:
    """Trials report every 200,000 or 300,000 iterations up to 2,000,000: the curves' x values are the steps
    reported (not two million of them, which blocked the page for seconds at each poll), each trial's line with a
    gap where it reported nothing, and the axis reads 1M, not 1000000. A fixed text parameter is a category axis
    of the hyper-parameters chart, and a run's tooltip gives its times in seconds, as its reasons and axis do."""
    url, token, _ = server
    area = shared_server[3] / "srv" / "users" / "dana"
    (area / "iterations.py").write_text(ITERATIONS)
    spec = real_spec("iterations", trial={"function": "iterations:train"},
                     search={"trials": 6, "space": {"rate": {"type": "uniform", "low": 0.5, "high": 5.0},
                                                    "every": {"type": "grid", "values": [200_000, 300_000]},
                                                    "optimizer": "adam"}},
                     metric={"name": "loss", "mode": "min"}, budget={"steps": 2_000_000})
    experiment_id = submit(url, token, spec)
    errors: list[str] = []
    page = signed_in(browser, url, token, errors)
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_function("() => window.hermesDashboard?.state.experiment?.status === 'finished'", timeout=60_000)
    updates_after(page, 1)
    steps = sorted({200_000 * k for k in range(1, 11)} | {300_000 * k for k in range(1, 7)})
    drawn = page.evaluate("() => window.hermesDashboard.charts.curves.data.map((column) => [...column])")
    assert drawn[0] == steps
    assert len(drawn) == 7
    by_every = {column.count(None): column for column in drawn[1:]}  # 10 reports, or 6
    assert set(by_every) == {len(steps) - 10, len(steps) - 6}
    assert [x for x, y in zip(steps, by_every[len(steps) - 6]) if y is not None] == [300_000 * k for k in range(1, 7)]
    labels = page.evaluate("() => window.hermesDashboard.charts.curves.axes[0]._values")
    assert "1M" in labels and all(len(label) <= 5 for label in labels), labels

    axes = page.evaluate("() => window.hermesDashboard.charts.parallel.getOption().parallelAxis")
    assert {axis["name"]: axis.get("data") for axis in axes}["optimizer"] == ["adam"]
    tooltip = page.evaluate("""() => describeRun({ trial: '0', gpu: 'local/cpu0', migrated: true, resumed: true,
        started_at: 588.6, start_reason: 'preempted trial 3 at 588.6s', yield_requested_at: 3700.2,
        yield_reason: 'its turn ended at 3700.2s', ended_at: 3710, ended_by: 'suspended', end_reason: 'yielded' })""")
    assert "migrated here at 588.6s: preempted" in tooltip and "asked to yield at 3700.2s" in tooltip, tooltip
    assert "suspended at 3710.0s" in tooltip, tooltip
    assert errors == []


def test_the_users_table_follows_weights_set_elsewhere_and_keeps_one_being_typed(
    server: tuple[str, str, str], browser: Any,
) -> None:
    """An admin's cluster view: dana's weight set through the API shows in the Users table at a poll, while the
    weight being typed for ada keeps its value and focus though ada's weight changed too."""
    url, token, admin_token = server
    errors: list[str] = []
    page = cluster_view(browser, url, admin_token, errors)
    field = page.locator('#users tr[data-user="ada"] input')
    field.fill("7")
    try:
        api(url, admin_token, "PUT", "/users/dana/weight", {"weight": 3})
        api(url, admin_token, "PUT", "/users/ada/weight", {"weight": 2})
        page.wait_for_function("""() => document.querySelector('#users tr[data-user="dana"] input').value === '3'""",
                               timeout=10_000)
        page.wait_for_timeout(2_500)  # a poll more
        assert field.input_value() == "7"
        assert page.evaluate("() => document.activeElement.closest('tr')?.dataset.user") == "ada"
        page.locator('#users tr[data-user="ada"] button').click()
        page.wait_for_selector("#users:not([aria-busy])")
        assert {u["user"]: u["weight"] for u in api(url, admin_token, "GET", "/users")} == {"dana": 3, "ada": 7}
    finally:
        for user in ("dana", "ada"):
            api(url, admin_token, "PUT", f"/users/{user}/weight", {"weight": 1})
    assert errors == []


def test_a_token_revoked_while_a_page_polls_logs_no_error(
    shared_server: tuple[str, str, str, Path], server: tuple[str, str, str], browser: Any,
) -> None:
    """The sign-in form says the token was refused, and that is all: the console holds no error but the browser's
    own line for the 401 (it logged "Error: unauthorised" with a stack, as if something had broken)."""
    url, _, _ = server
    root = shared_server[3] / "srv"
    token = add_user(root, "eve")
    experiment_id = submit(url, token, real_spec("revoked", trials=2, steps=100, sleep=0.1))  # cancelled after
    errors: list[str] = []
    page = signed_in(browser, url, token, errors)
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(f"{url}/#/experiments/{experiment_id}/trials/0")
    page.wait_for_selector("#leaderboard tbody tr", timeout=30_000)
    updates_after(page, 1)
    with closing(Accounts(ServerConfig(root=root).database_url)) as accounts:
        accounts.revoke("eve", None)
    page.wait_for_selector("#login:not([hidden])", timeout=10_000)
    assert page.inner_text("#login-error") == "Your token was refused."
    page.wait_for_timeout(2_500)  # any poll still on its way
    assert [error for error in errors if "401" not in error] == []
