"""The dashboard in a real browser: Debian's chromium driven by Playwright, against a real `hermes server`.

It opens the dashboard of a running experiment and checks that the leaderboard, the learning
curves and the GPU timeline render its real data (the timeline's canvas has painted bars), that
the page keeps its state (sorting, the selected trial) across live updates, and that the
experiment list shows a new submission without a reload; that the page says what went wrong (a failed
experiment's reason, a refusal, an unknown id) instead of nothing. Screenshots are kept in
``test-artifacts/`` (or $HERMES_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (test extra)")

from test_server import ROOT, _free_port, _until, _wait_for, add_user, real_spec  # noqa: E402

from hermes.store import ExperimentStatus, SqlStore  # noqa: E402

CHROMIUM = Path("/usr/lib/chromium/chromium")
ARTIFACTS = Path(os.environ.get("HERMES_TEST_ARTIFACTS", ROOT / "test-artifacts"))
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM}: apt-get install -y chromium (.ci/setup-services does)"
)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser for the module: each test's pages open in contexts of their own (``browser``)."""
    with playwright.sync_playwright() as p:
        browser = launch(p)
        yield browser
        browser.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """The module's browser; the contexts a test opened (a page and its storage each) close after it."""
    yield chromium
    for context in chromium.contexts:
        context.close()


@contextmanager
def hermes_server(directory: Path) -> Iterator[tuple[str, str, str]]:
    """A real server on a free port (a pool of two CPU slots) with a user and an admin, its root and its log in
    ``directory``; yields its URL and their tokens."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    root = directory / "srv"
    token = add_user(root, "dana")
    admin_token = add_user(root, "ada", admin=True)
    port = _free_port()
    with open(directory / "server.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), "--port",
                                    str(port), "--cpu-slots", "2"], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_for(url)
            yield url, token, admin_token
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def print_log(log: Path, offset: int = 0) -> None:
    """The server's log from ``offset`` on, less its requests answered 200: pytest shows it if the test failed."""
    with open(log) as file:
        file.seek(offset)
        lines = [line for line in file.read().splitlines() if '" 200 OK' not in line]
    print("the server's log, less its requests answered 200:", *lines[-80:], sep="\n")


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str, Path]]:
    """One server for the module's tests (2 s to start); yields its URL, the tokens and its folder."""
    directory = tmp_path_factory.mktemp("dashboard")
    with hermes_server(directory) as (url, token, admin_token):
        yield url, token, admin_token, directory


@pytest.fixture
def server(shared_server: tuple[str, str, str, Path]) -> Iterator[tuple[str, str, str]]:
    """The module's server, its pool idle: what a test left queued or running is cancelled after it. Its
    experiments and the pool's history stay, so a test finds its own by id, and no test may need the only ones."""
    import httpx

    url, token, admin_token, directory = shared_server
    offset = (directory / "server.log").stat().st_size
    yield url, token, admin_token
    headers = {"Authorization": f"Bearer {admin_token}"}

    def open_ones() -> list[int]:
        listed = httpx.get(f"{url}/api/experiments", headers=headers).json()
        return [experiment["id"] for experiment in listed if experiment["status"] in ("queued", "running")]

    for experiment_id in open_ones():
        httpx.post(f"{url}/api/experiments/{experiment_id}/cancel", headers=headers)
    _until(lambda: not open_ones(), timeout=60)
    print_log(directory / "server.log", offset)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A server of the test's own, for one that needs the pool's whole history to be its own."""
    try:
        with hermes_server(tmp_path) as started:
            yield started
    finally:
        print_log(tmp_path / "server.log")


def submit(url: str, token: str, spec: dict[str, object]) -> int:
    import httpx

    response = httpx.post(f"{url}/api/experiments", json={"spec": spec}, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_dashboard_of_a_running_experiment(server: tuple[str, str, str], browser: Any) -> None:
    url, token, _ = server
    experiment_id = submit(url, token, real_spec("watched", trials=6, steps=400, sleep=0.1))  # cancelled below
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)  # a 404
    page.goto(url)
    page.fill("#token", token)
    page.click("#login button")
    page.wait_for_selector(f'#experiments tr[data-id="{experiment_id}"]')

    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_function("() => (window.hermesDashboard?.state.runs.length ?? 0) >= 4", timeout=60_000)
    page.wait_for_selector("#leaderboard tbody tr")
    assert page.locator("#leaderboard tbody tr").count() == 6
    # sort by trial, ascending; select a trial: both must survive the live updates that follow
    page.click("#leaderboard th:has-text('trial')")
    page.click('#leaderboard tr[data-trial="3"]')
    updates = page.evaluate("() => window.hermesDashboard.updates")
    page.wait_for_function(f"() => window.hermesDashboard.updates >= {updates + 2}", timeout=30_000)
    order = page.locator("#leaderboard tbody tr").evaluate_all("rows => rows.map(r => r.dataset.trial)")
    assert order == sorted(order) and len(order) == 6
    assert page.locator('#leaderboard tr.selected').get_attribute("data-trial") == "3"
    page.wait_for_selector("#trial-config")
    page.wait_for_function("() => document.querySelector('#trial-metrics')?.rows.length > 1", timeout=30_000)

    # the curves: one uPlot series per trial that reported, drawn on its canvas
    assert page.evaluate("() => window.hermesDashboard.charts.curves.series.length - 1") >= 4
    assert painted(page, "#curves canvas") > 200
    # the timeline: a bar per run in the chart, and painted pixels of the trials' colours on its canvas
    page.wait_for_function("() => window.hermesDashboard.state.runs.filter(r => r.resumed).length >= 1",
                           timeout=60_000)
    page.wait_for_timeout(2500)
    drawn = page.evaluate("""() => ({  // at one moment: a poll may add a run between two evaluates
        bars: window.hermesDashboard.charts.timeline.getOption().series[0].data.length,
        runs: window.hermesDashboard.state.runs.filter(Boolean).length })""")
    assert drawn["bars"] == drawn["runs"] >= 4, drawn
    assert painted(page, "#timeline canvas") > 2000
    page.hover("#timeline canvas", position={"x": 200, "y": 40})
    page.locator("#timeline").screenshot(path=str(ARTIFACTS / "dashboard-timeline.png"))
    page.screenshot(path=str(ARTIFACTS / "dashboard-experiment.png"), full_page=True)

    # the cluster view while it runs: dana holds the GPUs (CPU slots here)
    page.goto(f"{url}/#/cluster")
    page.wait_for_selector("#cluster td:has-text('dana')")
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_selector('#leaderboard tr[data-trial="1"]')

    # a failed trial's stderr tail, then cancelling from the page
    page.click('#leaderboard tr[data-trial="1"]')
    page.wait_for_function("() => document.querySelector('#trial h3')?.textContent.startsWith('Trial 1')")
    page.select_option("#trial select", "stderr")
    page.wait_for_function("() => document.querySelector('#trial-log').textContent.includes('about to fail')",
                           timeout=30_000)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel")
    page.wait_for_selector("h2 .status.cancelled", timeout=60_000)

    # the list updates live: a new submission appears without a reload
    page.goto(f"{url}/#/")
    page.wait_for_selector(f'#experiments tr[data-id="{experiment_id}"]')
    second = submit(url, token, real_spec("arrives-later", trials=2, steps=2))
    page.wait_for_selector(f'#experiments tr[data-id="{second}"]', timeout=10_000)
    assert "arrives-later" in page.locator(f'#experiments tr[data-id="{second}"]').inner_text()
    page.wait_for_selector(f'#experiments tr[data-id="{second}"] .status.finished', timeout=60_000)  # runs, live
    page.screenshot(path=str(ARTIFACTS / "dashboard-list.png"))
    assert errors == []


def test_an_admin_sets_a_users_weight_from_the_cluster_view(server: tuple[str, str, str], browser: Any) -> None:
    """The admin's cluster view has a weight field per user that changes the fair share through the API; a bad
    value is refused with the API's message; a user who is no admin sees their own weight, with no control."""
    import httpx

    url, token, admin_token = server
    errors: list[str] = []
    page = cluster_view(browser, url, admin_token, errors)
    row = page.locator('#users tr[data-user="dana"]')
    row.locator("input").fill("2.5")
    row.locator("button").click()
    # the table is busy until it is drawn again from the API: an edit made before that would be replaced
    page.wait_for_selector("#users:not([aria-busy])")
    page.wait_for_function("""() => document.querySelector('#users tr[data-user="dana"] input')?.value === '2.5'
                              && !document.querySelector('#users-error').textContent""")
    listed = httpx.get(f"{url}/api/users", headers={"Authorization": f"Bearer {admin_token}"}).json()
    assert {one["user"]: one["weight"] for one in listed} == {"dana": 2.5, "ada": 1.0}

    page.locator('#users tr[data-user="dana"] input').fill("0")
    page.locator('#users tr[data-user="dana"] button').click()
    page.wait_for_selector("#users:not([aria-busy])")
    assert page.locator("#users-error").text_content().startswith("dana: 422")
    listed = httpx.get(f"{url}/api/users", headers={"Authorization": f"Bearer {token}"}).json()
    assert listed == [{"user": "dana", "admin": False, "weight": 2.5}]  # unchanged, and only herself

    other = cluster_view(browser, url, token, errors)
    other.wait_for_selector('#users tr[data-user="dana"] td:has-text("2.5")')
    assert other.locator("#users input, #users button").count() == 0
    assert other.locator('#users tr[data-user="ada"]').count() == 0
    assert errors == []


def test_the_pool_timeline_shows_every_users_runs_to_an_admin_and_others_as_anonymous(
    own_server: tuple[str, str, str], browser: Any,
) -> None:
    """Two users' experiments share the two slots. The admin's cluster view draws the pool's GPU timeline with
    both users' runs, in a colour per user; dana's shows ada's runs as another user's; a click on one of dana's
    runs opens its trial."""
    url, token, admin_token = own_server
    watched = submit(url, token, real_spec("long-one", trials=4, steps=200, sleep=0.05))  # runs until cancelled
    submit(url, admin_token, real_spec("short-one", trials=2, steps=20, sleep=0.05))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    admin = cluster_view(browser, url, admin_token, errors)
    admin.set_viewport_size({"width": 1400, "height": 1400})
    admin.wait_for_function("""() => { const runs = [...(window.hermesDashboard?.state.runs?.values() ?? [])];
                               return runs.some(r => r.owner === 'ada') && runs.some(r => r.owner === 'dana'); }""",
                            timeout=60_000)
    admin.wait_for_timeout(2500)  # a poll after: the chart holds what the state holds
    drawn = admin.evaluate("""() => ({  // at one moment: a poll may add a run between two evaluates
        bars: window.hermesDashboard.charts.pool.getOption().series[0].data.length,
        runs: window.hermesDashboard.state.runs.size })""")
    assert drawn["bars"] == drawn["runs"], drawn
    assert admin.evaluate("() => window.hermesDashboard.charts.pool.getOption().yAxis[0].data") == [
        "local/cpu0", "local/cpu1"]
    assert sorted(admin.locator("#pool-legend .swatch").evaluate_all("s => s.map(e => e.dataset.owner)")) == [
        "ada", "dana"]
    assert painted(admin, "#pool-timeline canvas") > 2000
    admin.locator("#pool-timeline").screenshot(path=str(ARTIFACTS / "dashboard-pool-timeline.png"))
    admin.screenshot(path=str(ARTIFACTS / "dashboard-cluster.png"), full_page=True)

    own = cluster_view(browser, url, token, errors)
    own.set_viewport_size({"width": 1400, "height": 1400})
    own.wait_for_function("() => [...(window.hermesDashboard?.state.runs?.values() ?? [])]"
                          ".some(r => r.owner === '(other users)')", timeout=60_000)
    owners = own.evaluate("() => [...new Set([...window.hermesDashboard.state.runs.values()].map(r => r.owner))]")
    assert sorted(owners) == ["(other users)", "dana"]
    assert own.evaluate("""() => [...window.hermesDashboard.state.runs.values()]
                           .filter(r => r.owner !== 'dana').every(r => r.trial === null && !r.start_reason)""")
    # click the middle of one of dana's finished runs: her trial opens. The click is made where the bar is
    # drawn at that moment, in the same evaluate: a poll in between redraws the chart on a longer axis.
    own.wait_for_timeout(2500)
    trial = own.evaluate("""() => {
        const chart = window.hermesDashboard.charts.pool, option = chart.getOption();
        const runs = [...window.hermesDashboard.state.runs.values()];
        const widest = runs.filter(r => r.owner === 'dana' && r.ended_at !== null)
          .sort((a, b) => (b.ended_at - b.started_at) - (a.ended_at - a.started_at))[0];
        chart.dispatchAction({ type: 'dataZoom', start: 0, end: 100 });
        const [x, y] = chart.convertToPixel({ gridIndex: 0 },
          [(widest.started_at + widest.ended_at) / 2, option.yAxis[0].data.indexOf(widest.gpu)]);
        const canvas = document.querySelector('#pool-timeline canvas'), box = canvas.getBoundingClientRect();
        const at = { clientX: box.left + x, clientY: box.top + y, bubbles: true, view: window };
        for (const type of ['mousemove', 'mousedown', 'mouseup', 'click']) {
          canvas.dispatchEvent(new MouseEvent(type, at));
        }
        return widest.trial;
    }""")
    own.wait_for_function(f"() => location.hash === '#/experiments/{watched}/trials/{trial}'")
    own.wait_for_selector(f'#leaderboard tr.selected[data-trial="{trial}"]', timeout=30_000)
    assert errors == []


def signed_in(browser: Any, url: str, token: str, errors: list[str], **page_options: Any) -> Any:
    """A new page signed in with ``token``, on the experiment list; page errors go to ``errors``."""
    page = browser.new_page(**page_options)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.fill("#token", token)
    page.click("#login button")
    page.wait_for_selector("#experiments")
    return page


def launch(p: Any) -> Any:
    return p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox", "--disable-gpu"])


def test_first_reports_single_reports_and_failure_marks_show(server: tuple[str, str, str], browser: Any) -> None:
    """Trials of one step each, and one that fails before its first report. The leaderboard and the chart give the
    time from each trial's submission to its first report (not the pool's clock at it); a trial's one report shows
    as a point on the learning curves; the failed run's ✕ is drawn on the GPU timeline."""
    import httpx

    url, token, _ = server
    time.sleep(1.5)  # the pool's clock runs from its start: its time at a first report is no time to first report
    spec = real_spec("one-step", trials=3, steps=1, sleep=0.3)
    for config in spec["search"]["configs"]:  # type: ignore[index]
        config["crash_step"] = 1  # trial 1 fails at once: no report, so no second run
    experiment_id = submit(url, token, spec)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    page = signed_in(browser, url, token, errors, viewport={"width": 1400, "height": 1600})
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_selector("h2 .status.finished", timeout=60_000)
    updates = page.evaluate("() => window.hermesDashboard.updates")
    page.wait_for_function(f"() => window.hermesDashboard.updates >= {updates + 1}")  # drawn once finished

    # the leaderboard's "first report" and the chart's points: seconds after the trial's submission
    trials = httpx.get(f"{url}/api/experiments/{experiment_id}/trials",
                       headers={"Authorization": f"Bearer {token}"}).json()["trials"]
    delays = {t["trial"]: t["first_report_at"] - t["submitted_at"] for t in trials if t["first_report_at"]}
    assert set(delays) == {"0", "2"} and all(t["submitted_at"] > 1 for t in trials)
    column = page.locator("#leaderboard th").all_inner_texts().index("first report")
    for trial, delay in delays.items():
        cell = page.locator(f'#leaderboard tr[data-trial="{trial}"] td').nth(column).inner_text()
        assert cell == f"{delay:.1f}s", (trial, cell, delay)
    plotted = page.evaluate("() => window.hermesDashboard.charts.first.getOption().series[0].data")
    assert sorted(point[1] for point in plotted) == pytest.approx(sorted(delays.values()))

    # the learning curves: each trial's one report is a point, painted in its colour
    assert page.evaluate("() => window.hermesDashboard.charts.curves.series.length - 1") == 2
    assert painted(page, "#curves canvas") > 20

    # the GPU timeline: the failed run ends in a ✕ of the mark's red, over its row
    failed = page.evaluate("""() => {
        const chart = window.hermesDashboard.charts.timeline, option = chart.getOption();
        const run = window.hermesDashboard.state.runs.find(r => r && r.ended_by === 'failed');
        const [x, y] = chart.convertToPixel({ gridIndex: 0 }, [run.ended_at, option.yAxis[0].data.indexOf(run.gpu)]);
        const canvas = document.querySelector('#timeline canvas'), ratio = canvas.width / canvas.clientWidth;
        const box = canvas.getContext('2d').getImageData(Math.round((x - 6) * ratio), Math.round((y - 6) * ratio),
                                                         Math.round(12 * ratio), Math.round(12 * ratio)).data;
        let red = 0;
        for (let i = 0; i < box.length; i += 4) {  // #b00020; a trial's colour (hsl, 45% light) has green >= 40
            if (box[i] > 120 && box[i + 1] < 25 && box[i + 2] < 70 && box[i + 3] > 200) red++;
        }
        return { red, trial: run.trial };
    }""")
    assert failed["trial"] == "1" and failed["red"] >= 10, failed
    page.locator("#timeline").screenshot(path=str(ARTIFACTS / "dashboard-failure-mark.png"))
    page.locator("#curves").screenshot(path=str(ARTIFACTS / "dashboard-single-reports.png"))
    assert errors == []


def test_a_failed_trial_ranks_last_on_the_leaderboard_whatever_it_reported(server: tuple[str, str, str], browser: Any) -> None:
    """Trial 1 reports the highest value, then fails at its next step: its best is no result (as in `hermes
    results`), so it ranks after the others, and the header names the best trial that did not fail. The page ranked
    it first."""
    url, token, _ = server
    spec = real_spec("failed-best", trials=3, steps=2)
    spec["search"]["configs"][1]["rate"] = 5.0  # type: ignore[index]  # 0.99 at step 1, then it raises at step 2
    experiment_id = submit(url, token, spec)
    errors: list[str] = []
    page = signed_in(browser, url, token, errors)
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_selector("h2 .status.finished", timeout=60_000)
    updates = page.evaluate("() => window.hermesDashboard.updates")
    page.wait_for_function(f"() => window.hermesDashboard.updates >= {updates + 1}")  # drawn once finished
    rows = page.locator("#leaderboard tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.trial, r.cells[0].textContent])")
    assert rows == [["2", "1"], ["0", "2"], ["1", "3"]], rows
    assert "1 failed · best 0.6988 (trial 2)" in page.locator(".controls").first.inner_text()
    assert errors == []


def test_a_running_bar_grows_and_a_refused_token_stops_the_view(server: tuple[str, str, str], browser: Any) -> None:
    """An experiment's view while its trial trains: the running bar of the GPU timeline grows with the pool's clock
    at every poll, though no run changed. Then the token is refused: the sign-in form replaces the view, whose
    polling stops. Signing in again builds the view anew; once the user leaves it, nothing asks for that
    experiment."""
    url, token, _ = server
    experiment_id = submit(url, token, real_spec("growing", trials=1, steps=10, sleep=1.0))
    errors: list[str] = []
    page = signed_in(browser, url, token, errors)
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_function("() => window.hermesDashboard?.state.runs.some(r => r && r.ended_at === null)",
                           timeout=30_000)
    drawn = """() => ({ updates: window.hermesDashboard.updates, runs: JSON.stringify(window.hermesDashboard.state.runs),
                        end: window.hermesDashboard.charts.timeline.getOption().xAxis[0].max })"""
    before = page.evaluate(drawn)
    page.wait_for_function(f"() => window.hermesDashboard.updates >= {before['updates'] + 1}")  # 2 s on
    after = page.evaluate(drawn)
    assert after["runs"] == before["runs"] and after["end"] > before["end"], (before, after)  # no run changed

    page.evaluate("() => { state.token = 'hermes_revoked'; }")  # as a revoked token: the next poll gets 401
    page.wait_for_selector("#login:not([hidden])")
    page.fill("#token", token)
    page.click("#login button")
    page.wait_for_selector("#leaderboard tbody tr")
    page.goto(f"{url}/#/")  # leave the view: its polls stop
    page.wait_for_selector(f'#experiments tr[data-id="{experiment_id}"]')
    page.wait_for_timeout(300)  # a request already on its way when the view was left
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    with page.expect_request(lambda request: request.url.endswith("/api/experiments"), timeout=30_000):
        page.wait_for_timeout(2500)  # a poll and more; the list polls
    assert [u for u in asked if f"/api/experiments/{experiment_id}" in u] == []
    assert errors == []


def test_a_long_name_wraps_and_a_phone_gets_one_column(server: tuple[str, str, str], browser: Any) -> None:
    """An experiment named with 127 characters leaves the page as wide as the window; on a phone the panels
    stack in one column as wide as the screen, and a wide table scrolls in its box, not the page."""
    url, token, _ = server
    name = ("a_very_long_experiment_name_" * 5)[:127]
    experiment_id = submit(url, token, real_spec(name, trials=2, steps=2))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    overflow = "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
    page = signed_in(browser, url, token, errors, viewport={"width": 1400, "height": 900})
    page.wait_for_selector(f'#experiments tr[data-id="{experiment_id}"]')
    page.goto(f"{url}/#/experiments/{experiment_id}")
    page.wait_for_selector("#leaderboard tbody tr")
    page.wait_for_function("() => (window.hermesDashboard?.updates ?? 0) >= 1")
    assert page.locator("h2").inner_text().startswith(name[:40])
    assert page.evaluate(overflow) == 0

    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(300)
    assert page.evaluate(overflow) == 0
    columns = page.evaluate("() => getComputedStyle(document.querySelector('.grid')).gridTemplateColumns")
    assert len(columns.split()) == 1, columns
    widths = page.locator(".grid > .panel").evaluate_all("panels => panels.map(p => p.offsetWidth)")
    assert len(widths) == 6 and min(widths) >= 340, widths
    assert page.evaluate("() => document.querySelector('#leaderboard').parentElement.clientWidth") <= 390
    page.screenshot(path=str(ARTIFACTS / "dashboard-phone.png"), full_page=True)

    page.goto(f"{url}/#/")  # the list too: its long name scrolls in the table's box
    page.wait_for_selector(f'#experiments tr[data-id="{experiment_id}"]')
    assert page.evaluate(overflow) == 0
    assert errors == []


def test_an_experiment_hermes_run_runs_in_the_store_offers_no_cancel_or_weight(
    server: tuple[str, str, str], browser: Any, shared_server: tuple[str, str, str, Path],
) -> None:
    """The pool never takes up an experiment that `hermes run` writes into the server's store (it has no owner): the
    page offered Cancel and Set weight, which the API refuses (409); it says who runs it instead, while it runs."""
    url, _, admin_token = server
    with closing(SqlStore(f"sqlite:///{shared_server[3] / 'srv' / 'hermes.db'}")) as store:
        local = store.create_or_open_experiment("run-locally", real_spec("run-locally"))  # as `hermes run` does
        try:
            errors: list[str] = []
            page = signed_in(browser, url, admin_token, errors)
            page.goto(f"{url}/#/experiments/{local}")
            page.wait_for_selector("#not-pooled")
            assert "stop that process to cancel it" in page.inner_text("#not-pooled")
            assert page.locator("#cancel").count() == 0 and page.locator("input#weight").count() == 0
            assert page.inner_text("span#weight") == "weight 1"
            store.set_status(local, ExperimentStatus.INTERRUPTED)  # as its runner leaves it: no process runs it now
            page.reload()
            page.wait_for_selector("h2:has-text('interrupted')")
            assert page.locator("#not-pooled").count() == 0 and page.locator("#cancel").count() == 0
            assert errors == []
        finally:
            store.set_status(local, ExperimentStatus.INTERRUPTED)  # the pool never takes it up: the fixture waits for none


def test_the_page_says_what_went_wrong_and_keeps_trials_in_submission_order(
    server: tuple[str, str, str], browser: Any, shared_server: tuple[str, str, str, Path],
) -> None:
    """One server, the pages a user opens on it: a finished experiment whose trial diverged (its last value
    "nan"), with its first reports and colours in submission order, whose trial panel empties when the user goes
    back, and whose weight is shown but not offered for a change; a failed
    experiment, whose reason shows in the list and the header as text; an unknown experiment, another user's and
    an unknown trial, each said once and not asked for again; a running experiment whose weight field, refused,
    shows the API's reason and the stored weight again, and whose cancel is refused as it ended meanwhile."""
    import httpx

    url, token, admin_token = server
    headers = {"Authorization": f"Bearer {token}"}
    spec = real_spec("diverging", trials=4, steps=3)
    for i, config in enumerate(spec["search"]["configs"]):  # type: ignore[index]
        config["report"] = "nan" if i == 2 else "ok"
    finished = submit(url, token, spec)
    admins = submit(url, admin_token, real_spec("admins", trials=1, steps=1))
    with closing(SqlStore(f"sqlite:///{shared_server[3] / 'srv' / 'hermes.db'}")) as store:  # the pool refuses it
        failed = store.submit_experiment("<b>odd", real_spec("named-otherwise"), "dana")
    _until(lambda: httpx.get(f"{url}/api/experiments/{finished}", headers=headers).json()["status"] == "finished")
    running = submit(url, token, real_spec("running", trials=1, steps=1000, sleep=0.05))  # cancelled below
    trials = httpx.get(f"{url}/api/experiments/{finished}/trials", headers=headers).json()["trials"]
    assert [t["last"] for t in trials if t["trial"] == "2"] == ["nan"]
    submitted = [t["trial"] for t in sorted(trials, key=lambda t: (t["submitted_at"], int(t["trial"])))]
    assert submitted != [t["trial"] for t in trials]  # the API sends them in another order: the page sorts them
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 1600})  # pages below share its token
    page = signed_in(context, url, token, errors)
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))

    # the failed experiment's reason, as text: its first line in the list, whole in its header
    reason = page.locator(f'#experiments tr[data-id="{failed}"] .reason')
    reason.wait_for(timeout=30_000)
    assert reason.inner_text().startswith("experiment <b>odd: its spec is named")
    page.goto(f"{url}/#/experiments/{failed}")
    page.wait_for_selector("#experiment-error")
    assert "<b>odd: its spec is named 'named-otherwise'" in page.locator("#experiment-error").inner_text()
    assert page.locator("#view b, #experiments b").count() == 0  # text, not an element made of it

    # the diverged trial: "nan" its last value, "-" its best; first reports and colours in submission order
    page.goto(f"{url}/#/experiments/{finished}")
    page.wait_for_function("() => window.hermesDashboard.charts.first?.getOption()?.series[0].data.length === 4")
    columns = page.locator("#leaderboard th").all_inner_texts()
    cells = page.locator('#leaderboard tr[data-trial="2"] td').all_inner_texts()
    assert (cells[columns.index("last")], cells[columns.index("best")]) == ("nan", "-")
    plotted = page.evaluate("() => window.hermesDashboard.charts.first.getOption().series[0].data")
    assert sorted((point[0], point[2]) for point in plotted) == list(enumerate(submitted))
    page.wait_for_function("() => window.hermesDashboard.charts.timelineDrawn")
    bars = page.evaluate("""() => {
        const runs = window.hermesDashboard.state.runs.filter(Boolean);
        const bars = window.hermesDashboard.charts.timeline.getOption().series[0].data;
        return runs.map((r, i) => [r.trial, bars[i].itemStyle.color]);
    }""")
    expected = page.evaluate("(trials) => trials.map((t, i) => [t, trialColour(i)])", submitted)
    assert {trial: colour for trial, colour in bars} == dict(expected)

    # it ended: it keeps the weight it ran with, shown, not offered for a change (the API refuses one: 409)
    assert page.locator("#weight").inner_text() == "weight 1"
    assert page.locator("#view .controls button:has-text('Set weight')").count() == 0

    # a trial opened, then back to the experiment: the panel empties and that trial is asked for no more
    page.click('#leaderboard tr[data-trial="0"]')
    page.wait_for_selector("#trial-config")
    page.go_back()
    page.wait_for_selector("#trial p.muted", timeout=5_000)
    assert page.locator("#trial-config").count() == 0
    asked.clear()

    # meanwhile, a page each: an unknown experiment, another user's, an unknown trial: the API's reason, said once
    refused = []
    for hash_, asked_for, shown, message in (
        (f"#/experiments/{failed + 100}", f"/api/experiments/{failed + 100}", "#not-found",
         f"no experiment {failed + 100}"),
        (f"#/experiments/{admins}", f"/api/experiments/{admins}", "#not-found", f"no experiment {admins}"),
        (f"#/experiments/{finished}/trials/nine", f"/api/experiments/{finished}/trials/nine", "#trial-missing",
         f"no trial 'nine' in experiment {finished}"),
    ):
        other = context.new_page()
        other.on("pageerror", lambda error: errors.append(str(error)))
        other.goto(f"{url}/{hash_}")
        other.wait_for_selector(shown)
        assert other.locator(shown).inner_text() == message
        again: list[str] = []
        other.on("request", lambda request, again=again: again.append(request.url))
        refused.append((hash_, asked_for, again))
    # a poll interval and more, watched on every page at once
    polled = f"/api/experiments/{finished}/trials?since="  # the experiment's trials are asked for still
    with page.expect_request(lambda request: polled in request.url, timeout=30_000):
        page.wait_for_timeout(2_500)
    assert [u for u in asked if "/trials/0" in u] == []
    for hash_, asked_for, again in refused:
        assert [u for u in again if asked_for in u] == [], hash_

    # the running experiment's weight refused: the API's reason beside the control, the field back to the
    # stored weight; then its cancel, refused as it was cancelled meanwhile
    page.goto(f"{url}/#/experiments/{running}")
    page.wait_for_selector("#cancel")
    page.fill("#weight", "0")
    page.click("#view .controls button:has-text('Set weight')")
    page.wait_for_function("() => document.querySelector('#control-error').textContent.startsWith('422 ')")
    assert "greater than or equal to" in page.locator("#control-error").inner_text()
    assert page.input_value("#weight") == "1"

    def cancelled_meanwhile(dialog: Any) -> None:  # the page waits on the dialog: its header still offers Cancel
        httpx.post(f"{url}/api/experiments/{running}/cancel", headers=headers)
        _until(lambda: httpx.get(f"{url}/api/experiments/{running}", headers=headers).json()["status"]
               == "cancelled")
        dialog.accept()

    page.once("dialog", cancelled_meanwhile)
    page.click("#cancel")
    page.wait_for_function("() => document.querySelector('#control-error').textContent.startsWith('409 ')")
    assert page.locator("#control-error").inner_text() == f"409 experiment {running} is cancelled already"
    assert errors == []


def cluster_view(browser: Any, url: str, token: str, errors: list[str]) -> Any:
    """A new page logged in with ``token`` on the cluster view; page errors go to ``errors``."""
    page = browser.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    page.fill("#token", token)
    page.click("#login button")
    page.goto(f"{url}/#/cluster")
    return page


def painted(page: object, selector: str) -> int:
    """Pixels of the canvas that are neither transparent nor white nor grey: what the chart drew in colour."""
    return page.evaluate(  # type: ignore[attr-defined]
        """(selector) => {
            let count = 0;
            for (const canvas of document.querySelectorAll(selector)) {
                const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
                for (let i = 0; i < data.length; i += 4) {
                    const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
                    if (a > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 40) count++;
                }
            }
            return count;
        }""",
        selector,
    )

