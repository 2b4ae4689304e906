"""The dashboard through a session in a real browser (Debian's chromium, driven by Playwright) against one real
`hermes server` of 32 CPU slots: signing in and out, the server going away and coming back, zooming a timeline
that grows with the clock, a metric whose trials differ in the fourth decimal, and a pool of 32 slots.

The server and the browser are shared by the module; the tests that stop the server come last and start it again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (test extra)")

from test_dashboard import CHROMIUM, launch, signed_in, submit  # noqa: E402
from test_server import ROOT, _free_port, _until, _wait_for, add_user, real_spec  # noqa: E402

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM}: apt-get install -y chromium (.ci/setup-services does)"
)
SLOTS = 32
NOT_A_TOKEN = "That is no token: a token holds only ASCII letters, digits, _ and -."


class HermesServer:
    """`hermes server` in a subprocess on a pool of CPU slots, with a user (dana) and an admin (ada); a test may
    stop it and start it again, on the same port and root, as an operator restarts one."""

    def __init__(self, directory: Path, slots: int) -> None:
        self.env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.root = directory / "srv"
        self.token = add_user(self.root, "dana")
        self.admin_token = add_user(self.root, "ada", admin=True)
        self.slots = slots
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log_path = directory / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "hermes.cli", "server", "--root", str(self.root), "--port",
                 self.url.rsplit(":", 1)[1], "--cpu-slots", str(self.slots)],
                stdout=log, stderr=subprocess.STDOUT, env=self.env)
        _wait_for(self.url)

    def stop(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HermesServer]:
    server = HermesServer(tmp_path_factory.mktemp("dashboard-session"), SLOTS)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        lines = [line for line in server.log_path.read_text().splitlines() if '" 200 OK' not in line]
        print("the server's log, less its requests answered 200:", *lines[-80:], sep="\n")  # shown if a test failed


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = launch(p)
        yield browser
        browser.close()


@pytest.fixture
def errors() -> Iterator[list[str]]:
    """The page errors a test's pages raise: none, once it is over."""
    errors: list[str] = []
    yield errors
    assert errors == []


def finished(server: HermesServer, spec: dict[str, Any]) -> int:
    """Submit ``spec`` as dana and wait for it to finish."""
    import httpx

    experiment_id = submit(server.url, server.token, spec)
    _until(lambda: httpx.get(f"{server.url}/api/experiments/{experiment_id}",
                             headers=server.headers()).json()["status"] == "finished", timeout=60)
    return experiment_id


def test_a_token_that_cannot_be_sent_or_is_refused_is_said_at_the_form_and_not_kept(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """A token pasted with a "…" (which no browser sends in a header) and an unknown one: each is said beside the form
    and neither is kept, so a reload shows the form again. One an older page kept is dropped, the form shown."""
    url, token = hermes_server.url, hermes_server.token
    page = browser.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    stored = "() => localStorage.getItem('hermesToken')"
    said = "() => document.querySelector('#login-error').textContent"
    page.goto(url)
    page.fill("#token", token[:20] + "…")
    page.click("#login button")
    page.wait_for_function(f"() => ({said})() !== ''", timeout=5_000)
    assert page.evaluate(said) == NOT_A_TOKEN
    assert page.is_visible("#token") and page.evaluate(stored) is None
    page.reload()
    page.wait_for_selector("#login:not([hidden])", timeout=5_000)

    page.fill("#token", "hermes_" + "x" * 43)  # well formed, unknown to the server
    page.click("#login button")
    page.wait_for_function(f"() => ({said})() !== ''", timeout=5_000)
    assert page.evaluate(said) == "Your token was refused."
    assert page.is_visible("#token") and page.evaluate(stored) is None

    page.evaluate("(kept) => localStorage.setItem('hermesToken', kept)", token + "…")  # as an older page kept it
    page.reload()
    page.wait_for_selector("#login:not([hidden])", timeout=5_000)
    assert page.evaluate(said) == NOT_A_TOKEN and page.evaluate(stored) is None

    page.fill("#token", token)
    page.click("#login button")
    page.wait_for_selector("#experiments")
    assert page.evaluate(stored) == token
    page.close()


def test_signing_out_or_a_refused_token_leaves_no_name_in_the_header(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """Signing out, and a token refused while the page polls (as a revoked one): the header no longer names the user
    nor offers to sign out."""
    url = hermes_server.url
    page = signed_in(browser, url, hermes_server.token, errors)
    page.wait_for_function("() => document.querySelector('#who').textContent === 'dana'")
    page.click("#logout")
    page.wait_for_selector("#login:not([hidden])")
    assert page.inner_text("#who") == "" and page.is_hidden("#logout")

    page.fill("#token", hermes_server.admin_token)
    page.click("#login button")
    page.wait_for_selector("#experiments")
    page.wait_for_function("() => document.querySelector('#who').textContent === 'ada (admin)'")
    assert page.is_visible("#logout")
    page.evaluate("() => { state.token = 'hermes_revoked'; }")  # as a revoked token: the next poll gets 401
    page.wait_for_selector("#login:not([hidden])")
    assert page.inner_text("#who") == "" and page.is_hidden("#logout")
    page.close()


def test_a_pool_of_32_slots_has_a_named_row_each_in_natural_order(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """32 trials on the 32 slots: the experiment's GPU timeline and the pool's have a row per slot, cpu2 before
    cpu10, each named and as tall as a name, the chart growing to hold them."""
    spec = real_spec("wide", trials=SLOTS, steps=1, sleep=0.0)
    for config in spec["search"]["configs"]:
        config["crash"] = "none"
    experiment_id = finished(hermes_server, spec)
    slots = [f"local/cpu{i}" for i in range(SLOTS)]
    page = signed_in(browser, hermes_server.url, hermes_server.token, errors, viewport={"width": 1400, "height": 1000})
    for view, chart, box in ((f"#/experiments/{experiment_id}", "timeline", "#timeline"),
                             ("#/cluster", "pool", "#pool-timeline")):
        page.goto(f"{hermes_server.url}/{view}")
        page.wait_for_function(f"() => window.hermesDashboard?.charts.{chart}?.getOption()?.yAxis[0].data.length "
                               f"=== {SLOTS}", timeout=30_000)
        drawn = page.evaluate("""([name, box]) => {
            const chart = window.hermesDashboard.charts[name];
            const at = (row) => chart.convertToPixel({ gridIndex: 0 }, [0, row]);
            const labels = chart.getZr().storage.getDisplayList(true).map(e => e.style?.text)
              .filter(text => typeof text === 'string' && text.startsWith('local/'));
            return { rows: chart.getOption().yAxis[0].data, labels, row: at(1)[1] - at(0)[1],
                     height: document.querySelector(box).clientHeight };
        }""", [chart, box])
        assert drawn["rows"] == slots, view
        assert sorted(drawn["labels"]) == sorted(slots), view  # every row named
        assert drawn["row"] >= 18 and drawn["height"] >= SLOTS * 18, (view, drawn["row"], drawn["height"])
    page.close()


def test_the_metric_axis_tells_close_values_apart_and_the_colours_span_them(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """Four trials whose best values are 0.99966 to 0.99993: the parallel coordinates' metric axis labels its ticks
    each differently (not "1" each), and the lines' colours run from the lowest value to the highest."""
    spec = real_spec("close", trials=4, steps=1, sleep=0.0)
    for config, rate in zip(spec["search"]["configs"], (8.0, 8.5, 9.0, 9.5), strict=True):
        config["rate"] = rate  # score = 1 - exp(-rate) at step 1
    experiment_id = finished(hermes_server, spec)
    page = signed_in(browser, hermes_server.url, hermes_server.token, errors)
    page.goto(f"{hermes_server.url}/#/experiments/{experiment_id}")
    page.wait_for_function("() => window.hermesDashboard?.charts.parallel.getOption()?.series[0].data.length === 4")
    shown = page.evaluate("""() => {
        const chart = window.hermesDashboard.charts.parallel, option = chart.getOption();
        const axis = chart.getModel().getComponent('parallelAxis', option.parallelAxis.length - 1);
        return { labels: axis.axis.scale.getTicks().map(tick => String(axis.option.axisLabel.formatter(tick.value))),
                 colours: [option.visualMap[0].min, option.visualMap[0].max],
                 bests: [...window.hermesDashboard.state.trials.values()].map(t => t.best) };
    }""")
    assert min(shown["bests"]) == pytest.approx(0.99966, abs=1e-5) and max(shown["bests"]) < 0.99993
    assert len(shown["labels"]) >= 3 and len(set(shown["labels"])) == len(shown["labels"]), shown["labels"]
    assert shown["colours"] == [min(shown["bests"]), max(shown["bests"])]
    page.close()


def test_a_zoomed_timeline_stays_on_its_seconds_while_the_clock_runs(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """A trial trains on: the experiment's GPU timeline and the pool's, zoomed with the wheel, show the same
    seconds after updates that moved the axis' end on with the clock."""
    import httpx

    url = hermes_server.url
    experiment_id = submit(url, hermes_server.token, real_spec("zoomed", trials=1, steps=2000, sleep=0.05))
    try:
        page = signed_in(browser, url, hermes_server.token, errors, viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/#/experiments/{experiment_id}")
        page.wait_for_function("() => window.hermesDashboard?.state.runs.some(r => r && r.ended_at === null)",
                               timeout=30_000)
        assert_zoom_holds(page, "timeline", "#timeline")
        page.goto(f"{url}/#/cluster")
        page.wait_for_function("() => window.hermesDashboard?.state.drawn")
        assert_zoom_holds(page, "pool", "#pool-timeline")
        page.close()
    finally:
        httpx.post(f"{url}/api/experiments/{experiment_id}/cancel", headers=hermes_server.headers())
        _until(lambda: httpx.get(f"{url}/api/experiments/{experiment_id}",
                                 headers=hermes_server.headers()).json()["status"] == "cancelled")


def assert_zoom_holds(page: Any, chart: str, box: str) -> None:
    """Zoom the timeline ``chart`` by the wheel in its middle; the seconds it shows stay as the clock moves on."""
    shown = f"() => window.hermesDashboard.charts.{chart}.getModel().getComponent('xAxis', 0).axis.scale.getExtent()"
    end = f"() => window.hermesDashboard.charts.{chart}.getOption().xAxis[0].max"
    page.wait_for_function(f"() => ({end})() >= 6", timeout=30_000)  # seconds to zoom into
    page.locator(box).scroll_into_view_if_needed()
    frame = page.locator(box).bounding_box()
    page.mouse.move(frame["x"] + frame["width"] * 0.5, frame["y"] + 30)
    for _ in range(4):
        page.mouse.wheel(0, -200)
        page.wait_for_timeout(50)
    zoomed, at = page.evaluate(shown), page.evaluate(end)
    assert zoomed[1] - zoomed[0] < 0.8 * at, zoomed  # zoomed in
    page.wait_for_function(f"() => ({end})() >= {at + 1}", timeout=30_000)  # drawn again, the axis a poll longer
    assert page.evaluate(shown) == pytest.approx(zoomed, abs=0.01)


def test_an_open_page_says_it_lost_the_server_until_it_answers_again(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """The server stops under an open page: a notice says since when the page shows nothing new, and goes once
    the server answers again."""
    page = signed_in(browser, hermes_server.url, hermes_server.token, errors)
    notice = page.locator("#connection")
    assert notice.is_hidden()
    hermes_server.stop()
    try:
        notice.wait_for(state="visible", timeout=5_000)
        assert re.fullmatch(r"connection lost — last updated \d\d:\d\d:\d\d, retrying", notice.inner_text())
        assert page.locator("#experiments").count() == 1  # what it showed, kept
    finally:
        hermes_server.start()
    notice.wait_for(state="hidden", timeout=10_000)
    page.close()


def test_a_view_opened_while_the_server_is_down_is_built_once_it_answers(
    hermes_server: HermesServer, browser: Any, errors: list[str],
) -> None:
    """The user opens the cluster view while the server restarts: the page says it retries, and builds the view
    when the server answers, instead of staying blank."""
    page = signed_in(browser, hermes_server.url, hermes_server.token, errors)
    hermes_server.stop()
    try:
        page.click("header nav a:has-text('Cluster')")
        page.wait_for_selector("#connection:has-text('retrying')", timeout=5_000)
        assert page.inner_text("#view") == ""
    finally:
        hermes_server.start()
    page.wait_for_selector("#cluster", timeout=10_000)
    assert page.locator("#connection").is_hidden() and page.inner_text("#who") == "dana"
    page.close()
