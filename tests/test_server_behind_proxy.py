"""`hermes server` behind a reverse proxy that serves it under a path (https://gpus.example.com/hermes/), as a
platform team puts it beside its other services: the dashboard, /docs and the command-line client all work there.

The proxy is a real one in this process (``PrefixProxy``: it strips the prefix, as nginx's ``location /hermes/ {
proxy_pass http://127.0.0.1:8600/; }`` does, and knows nothing else of the server). The dashboard's pages used
absolute URLs (/static/app.js, /api/...), which went to the proxy's own site: a blank page behind any prefix.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")
playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (test extra)")

from test_dashboard import CHROMIUM, launch, signed_in  # noqa: E402
from test_server import ROOT, _free_port, _until, _wait_for, add_user, real_spec  # noqa: E402

from hermes.server.client import Client  # noqa: E402

PREFIX = "/hermes"
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM}")


class PrefixProxy(BaseHTTPRequestHandler):
    """Forwards PREFIX/... to the upstream server's /...; anything else is the proxy's own site's: 404."""

    upstream: tuple[str, int]
    seen: list[str]

    def _forward(self) -> None:
        self.seen.append(self.path)
        if self.path == PREFIX:  # as nginx does for a location with a trailing slash
            self.send_response(301)
            self.send_header("Location", PREFIX + "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not self.path.startswith(PREFIX + "/"):
            self.send_error(404, "not this proxy's Hermes")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        connection = http.client.HTTPConnection(*self.upstream, timeout=30)
        headers = {key: value for key, value in self.headers.items() if key.lower() not in HOP_BY_HOP}
        connection.request(self.command, self.path[len(PREFIX):], body or None, headers)
        answer = connection.getresponse()
        payload = answer.read()
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in HOP_BY_HOP | {"content-length", "date", "server"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        connection.close()

    do_GET = do_POST = do_PUT = _forward

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """A real server told its path (--root-path), behind a PrefixProxy; the proxied URL, a token, the paths asked."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    root = tmp_path / "srv"
    token = add_user(root, "dana")
    port = _free_port()
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), "--port",
                                   str(port), "--cpu-slots", "1", "--root-path", PREFIX + "/"],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)
    seen: list[str] = []
    handler = type("Handler", (PrefixProxy,), {"upstream": ("127.0.0.1", port), "seen": seen})
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        _wait_for(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{proxy.server_address[1]}{PREFIX}", token, seen
    finally:
        proxy.shutdown()
        proxy.server_close()
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_the_dashboard_docs_and_client_work_under_a_proxys_path(proxied: tuple[str, str, list[str]]) -> None:
    url, token, seen = proxied
    client = Client(url, token)
    experiment_id = client.submit(real_spec("behind", trials=2, steps=2))["id"]
    _until(lambda: client.request("GET", f"/experiments/{experiment_id}")["status"] == "finished", timeout=60)
    assert client.request("GET", "/me")["name"] == "dana"
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = launch(p)
        try:
            page = signed_in(browser, url + "/", token, errors)
            page.wait_for_selector(f"#experiments tr[data-id='{experiment_id}']", timeout=15_000)
            assert f"--server {url}" in page.inner_text("body")  # the hint names the proxied URL, with its path
            page.goto(f"{url}/#/experiments/{experiment_id}")
            page.wait_for_selector("#leaderboard tbody tr", timeout=15_000)
            docs = browser.new_page()
            docs.goto(f"{url}/docs")
            docs.wait_for_selector(".opblock-summary-path[data-path=\"/api/experiments\"]", timeout=15_000)
            assert docs.locator(".servers select option").first.inner_text() == PREFIX  # Try it out calls there
            assert errors == []
        finally:
            browser.close()
    assert seen and all(path.startswith(PREFIX) for path in seen), seen  # nothing went to the proxy's own site
    assert {urlsplit(path).path for path in seen} >= {f"{PREFIX}/static/app.js", f"{PREFIX}/openapi.json",
                                                      f"{PREFIX}/api/me"}
