"""The dashboard in a real browser (chromium through Playwright) over a store with a damaged record: the API names the
record in the experiment's ``damaged`` field, and the page must say it where the experiment is listed and opened,
not show a row without trials and a view without anything, nor ask again every 2 s for what fails."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (test extra)")

from test_dashboard import ARTIFACTS, CHROMIUM, launch, signed_in
from test_server_damage import DAMAGES, Served, served  # noqa: F401  (served: the fixture)

from hermes.store import ExperimentStatus
from hermes.testing.recorded import experiment_spec, record_simulated

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM}: apt-get install -y chromium (.ci/setup-services does)"
)


def test_an_experiment_with_a_damaged_record_says_so_in_the_list_its_page_and_the_cluster_view(
    served: Served,  # noqa: F811
) -> None:
    """A running experiment whose trial record was edited by hand: the list showed it with no trials and no reason,
    its page stayed blank (its first read of trials failed, so nothing was drawn) while it asked for them every 2 s,
    and the cluster view left its runs out without a word. Now each says that a record is damaged, and the
    experiment's page names it whole; mended, the page shows the experiment again."""
    store = served.hermes.store
    ids = {}
    for name in ("good", "bad"):
        ids[name] = store.submit_experiment(name, experiment_spec(name, 4, 3), "alice")
        record_simulated(store, ids[name], 4, 3, seed=len(name), policy="rr")
    bad = ids["bad"]
    store.set_status(bad, ExperimentStatus.RUNNING)  # open: the cluster timeline reads it too
    database = served.hermes.config.root / "hermes.db"
    with closing(sqlite3.connect(database)) as connection, connection:
        (budget,) = connection.execute("SELECT budget FROM trials WHERE experiment_id = ? AND trial_id = '1'",
                                       (bad,)).fetchone()
        assert connection.execute(DAMAGES["trial budget"], {"id": bad}).rowcount == 1
    code, listed = served.get(f"/experiments/{bad}")
    detail = listed["damaged"]
    assert code == 200 and detail.startswith("the server's store has a damaged record: "), listed

    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = launch(p)
        page = signed_in(browser, served.url, served.tokens["alice"], errors, viewport={"width": 1400, "height": 900})
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))

        # the list: the damaged one marked, its reason's first line beside its status and whole on hover
        mark = page.locator(f'#experiments tr[data-id="{bad}"] .damaged')
        mark.wait_for(timeout=10_000)
        assert mark.inner_text().startswith("damaged record")
        assert mark.get_attribute("title") == detail
        assert detail[:40] in mark.inner_text()
        assert page.locator(f'#experiments tr[data-id="{ids["good"]}"] .damaged').count() == 0
        page.locator("#experiments").screenshot(path=str(_artifact("dashboard-damaged-list.png")))

        # its page: the record named whole in the header, no empty charts, nothing asked that fails
        page.goto(f"{served.url}/#/experiments/{bad}")
        page.wait_for_selector("#experiment-damaged", timeout=10_000)
        assert detail in page.locator("#experiment-damaged").inner_text()
        assert "trials not shown" in page.locator("#view .controls").inner_text()
        assert page.locator("#view .grid").is_hidden()
        asked.clear()
        page.wait_for_timeout(2_500)
        assert any(url.endswith(f"/api/experiments/{bad}") for url in asked)  # it polls on, to show it once mended
        assert [url for url in asked if f"/api/experiments/{bad}/" in url] == []
        page.screenshot(path=str(_artifact("dashboard-damaged-experiment.png")))

        # the cluster view: the pool's timeline says which experiment it leaves out, and links to it
        page.goto(f"{served.url}/#/cluster")
        left_out = page.locator("#pool-damaged")
        left_out.wait_for(timeout=10_000)
        assert f"experiment {bad}" in left_out.inner_text()
        assert left_out.locator("a").get_attribute("href") == f"#/experiments/{bad}"

        # mended by its administrator: its page shows the experiment
        with closing(sqlite3.connect(database)) as connection, connection:
            connection.execute("UPDATE trials SET budget = ? WHERE experiment_id = ? AND trial_id = '1'",
                               (budget, bad))
        page.goto(f"{served.url}/#/experiments/{bad}")
        page.wait_for_selector('#leaderboard tr[data-trial="1"]', timeout=10_000)
        assert page.locator("#experiment-damaged").count() == 0 and page.locator("#view .grid").is_visible()
        browser.close()
    assert errors == []


def _artifact(name: str) -> Any:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name
