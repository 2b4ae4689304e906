"""Dashboard at scale: a recorded experiment of 5,000 trials, read through the server's API and drawn in chromium.

Records a simulated experiment (real core, engine loop and StoreRecorder, simulated time) into
a server's SQLite store, then measures, on the real application:

- the first full read of each endpoint the experiment page polls (trials, curves, timeline), and of the
  pool's timeline that the cluster view polls,
  its time and size, which includes building the experiment's digest from the store;
- a poll with the cursors just returned, when nothing is new (what a dashboard does most);
- with chromium installed: the time from opening the page to the leaderboard, curves and
  timeline drawn, and the time of one live update after that.

Target: a poll with nothing new under 50 ms; the page drawn within a few seconds.
Run: python bench/dashboard.py [--trials 5000] [--epochs 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from fastapi.testclient import TestClient

from hermes.server.app import ServerConfig, create_app
from hermes.testing.recorded import experiment_spec, record_simulated

CHROMIUM = Path("/usr/lib/chromium/chromium")


def timed(client: TestClient, path: str, headers: dict[str, str]) -> tuple[float, int, dict]:
    start = time.perf_counter()
    response = client.get(path, headers=headers)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, len(response.content), response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    # tmpfs where there is one: the bench measures reading, not the fsync of every recorded event
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as root:
        run(Path(root), args.trials, args.epochs)


def run(root: Path, trials: int, epochs: int) -> None:
    app = create_app(ServerConfig(root=root, run_experiments=False))
    with TestClient(app) as client:
        hermes = app.state.hermes
        token = hermes.accounts.add_user("bench")
        headers = {"Authorization": f"Bearer {token}"}
        experiment_id = hermes.store.submit_experiment(
            "scale", experiment_spec("scale", trials, epochs), "bench"
        )
        start = time.perf_counter()
        record_simulated(hermes.store, experiment_id, trials, epochs, policy="hermes")
        events = len(hermes.store.events(experiment_id))
        reports = len(hermes.store.metrics(experiment_id))
        print(f"recorded {trials} trials: {events} events, {reports} reports in "
              f"{time.perf_counter() - start:.1f}s")
        base = f"/api/experiments/{experiment_id}"
        first: dict[str, dict] = {}
        for name, path in [("detail", base), ("trials", f"{base}/trials"), ("curves", f"{base}/curves?limit=200000"),
                           ("timeline", f"{base}/timeline"), ("pool", "/api/cluster/timeline")]:
            seconds, size, body = timed(client, path, headers)
            first[name] = body
            print(f"first read  {name:<9} {seconds * 1000:8.1f} ms {size / 1e6:7.2f} MB")
        time.sleep(0.6)  # past the digest's refresh interval, so the poll reads the store again
        for name, path in [("detail", base), ("trials", f"{base}/trials?since={first['trials']['version']}"),
                           ("curves", f"{base}/curves?after={first['curves']['cursor']}"),
                           ("timeline", f"{base}/timeline?since={first['timeline']['version']}"),
                           ("pool", f"/api/cluster/timeline?since={first['pool']['cursor']}")]:
            seconds, size, _ = timed(client, path, headers)
            print(f"poll        {name:<9} {seconds * 1000:8.1f} ms {size / 1e3:7.2f} kB")
        if CHROMIUM.exists():
            browser_figures(client, experiment_id, token)


def browser_figures(client: TestClient, experiment_id: int, token: str) -> None:
    """Serve the app on a real port for chromium, and time the page."""
    import socket
    import threading

    import uvicorn
    from playwright.sync_api import sync_playwright

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(client.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(url)
            page.evaluate(f"() => localStorage.setItem('hermesToken', {json.dumps(token)})")
            start = time.perf_counter()
            page.goto(f"{url}/#/experiments/{experiment_id}")
            page.reload()
            page.wait_for_function("() => (window.hermesDashboard?.updates ?? 0) >= 1", timeout=120_000)
            drawn = time.perf_counter() - start
            updates = page.evaluate("() => window.hermesDashboard.updates")
            start = time.perf_counter()
            page.wait_for_function(f"() => window.hermesDashboard.updates >= {updates + 1}", timeout=120_000)
            poll = time.perf_counter() - start
            rows = page.locator("#leaderboard tbody tr").count()
            bars = page.evaluate("() => window.hermesDashboard.charts.timeline.getOption().series[0].data.length")
            series = page.evaluate("() => window.hermesDashboard.charts.curves.series.length - 1")
            print(f"browser     page drawn in {drawn:.2f}s ({rows} leaderboard rows shown, {series} curves, "
                  f"{bars} timeline bars); next live update after {poll:.2f}s (poll interval 2 s)")
            start = time.perf_counter()
            page.goto(f"{url}/#/cluster")
            page.wait_for_function("() => window.hermesDashboard?.state.drawn", timeout=120_000)
            bars = page.evaluate("() => window.hermesDashboard.charts.pool.getOption().series[0].data.length")
            print(f"browser     cluster view's pool timeline drawn in {time.perf_counter() - start:.2f}s ({bars} bars)")
            browser.close()
    finally:
        server.should_exit = True
        thread.join(timeout=10)


if __name__ == "__main__":
    main()
