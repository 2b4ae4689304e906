"""The server's bounds on what one user may cost everyone, and on what its pages may load.

An Optuna sampler is built and asked in the server's process (in a request thread at the spec check, then in the
pool's one loop), so its costly arguments and the spaces of the samplers that list every value are bounded there, and
refused naming the field; ``hermes run`` keeps taking them. Every answer carries a Content-Security-Policy and
X-Frame-Options, and /docs loads the vendored Swagger UI, no third-party script (checked in chromium too).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra")

from fastapi.testclient import TestClient
from test_server import ROOT, Server, _free_port, _wait_for, give_code, real_spec

from hermes.errors import SpecError
from hermes.experiment import parse_spec
from hermes.experiment.spec import MAX_TRIALS
from hermes.server.app import ServerConfig, create_app

CHROMIUM = Path("/usr/lib/chromium/chromium")
RATE = {"rate": {"type": "uniform", "low": 0.1, "high": 0.9}}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server that runs nothing (the pool's own check is called directly), with alice, bob and root."""
    config = ServerConfig(root=tmp_path / "server", max_body=64 * 1024, run_experiments=False)
    with TestClient(create_app(config)) as client:
        yield Server(client)


def sampler_spec(name: str, sampler: Any, space: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**real_spec(name), "search": {"sampler": sampler, "trials": 2, "space": space or RATE}}


def refusal(server: Server, spec: dict[str, Any]) -> tuple[list[str], str]:
    """The field (below the spec) and the message of the one problem ``spec`` is refused with."""
    response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"][:2] == ["body", "spec"], problem
    return problem["loc"][2:], problem["msg"]


# ---------------------------------------------------------------------- what a sampler may cost
@pytest.mark.parametrize(("sampler", "field"), [
    ({"optuna": "optuna.samplers.TPESampler", "args": {"n_startup_trials": 0, "n_ei_candidates": 20_000}},
     "n_ei_candidates"),
    ({"name": "tpe", "args": {"n_ei_candidates": "1e6"}}, "n_ei_candidates"),  # text, as a YAML 1.1 loader gives it
    ({"optuna": "optuna.samplers._tpe.sampler.TPESampler", "args": {"n_ei_candidates": 20_000}}, "n_ei_candidates"),
    ({"name": "cmaes", "args": {"popsize": 10**7}}, "popsize"),
    ({"optuna": "optuna.samplers.NSGAIISampler", "args": {"population_size": 10**6}}, "population_size"),
    ({"optuna": "optuna.samplers.NSGAIIISampler", "args": {"dividing_parameter": 10**9}}, "dividing_parameter"),
])
def test_a_samplers_costly_argument_is_refused_naming_it(server: Server, sampler: dict[str, Any], field: str) -> None:
    """Before, each was built and asked in the server (20,000 TPE candidates: seconds at the check, then at every
    ask in the pool's loop; CMA-ES's 10**7 weights and NSGA-III's tuple of 10**9 once the pool got that far)."""
    loc, message = refusal(server, sampler_spec("costly", sampler))
    assert loc == ["search", "sampler", "args", field]
    assert "the server takes" in message and "at most" in message


def test_a_samplers_arguments_within_the_bounds_are_taken(server: Server) -> None:
    for index, sampler in enumerate([{"name": "tpe", "args": {"n_ei_candidates": 1000}},
                                     {"optuna": "optuna.samplers.NSGAIISampler", "args": {"population_size": 10_000}}]):
        response = server.client.post("/api/experiments", json={"spec": sampler_spec(f"fine-{index}", sampler)},
                                      headers=server.as_("alice"))
        assert response.status_code == 201, response.text


def test_a_grid_sampler_of_more_combinations_than_an_experiment_may_have_is_refused_before_it_is_built(
    server: Server,
) -> None:
    """GridSampler lists every combination of its search_space when built: 3 x 200 values, a 3 KB spec, grew the
    server by 560 MB. More than MAX_TRIALS (Hermes's own grid's bound) is refused; a grid that fits is taken."""
    values = list(range(1001))
    too_many = {"optuna": "optuna.samplers.GridSampler", "args": {"search_space": {"a": values, "b": values}}}
    loc, message = refusal(server, sampler_spec("grid-bomb", too_many))
    assert loc == ["search", "sampler", "args", "search_space"]
    assert f"more than {MAX_TRIALS:,} combinations" in message
    fits = {"optuna": "optuna.samplers.GridSampler", "args": {"search_space": {"rate": [0.2, 0.4]}}}
    spec = sampler_spec("grid", fits, {"rate": {"type": "choice", "values": [0.2, 0.4]}})
    response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
    assert response.status_code == 201, response.text


def test_the_samplers_that_list_the_spaces_values_are_bounded_by_the_space(server: Server) -> None:
    """BruteForceSampler lists each parameter's values as it asks (an int range of 10**7 took 58 s and 1.3 GB), and
    GPSampler lays out an int range's values at each proposal (1 GiB for 2**26)."""
    wide = {"n": {"type": "int", "low": 0, "high": 2_000_000}}
    loc, message = refusal(server, sampler_spec("brute", {"optuna": "optuna.samplers.BruteForceSampler"}, wide))
    assert loc == ["search", "space"] and f"more than {MAX_TRIALS:,} combinations" in message
    loc, message = refusal(server, sampler_spec("gp", {"name": "gp"}, {"n": {"type": "int", "low": 0, "high": 2**21}}))
    assert loc == ["search", "space", "n"] and "GPSampler" in message
    narrow = sampler_spec("brute-fine", {"optuna": "optuna.samplers.BruteForceSampler"},
                          {"rate": {"type": "choice", "values": [0.2, 0.4]}})
    response = server.client.post("/api/experiments", json={"spec": narrow}, headers=server.as_("alice"))
    assert response.status_code == 201, response.text


def test_a_stored_spec_past_the_bounds_is_refused_when_the_pool_takes_it_up(server: Server) -> None:
    """A spec stored before the bounds (or written into the store otherwise) is checked again by the pool's read."""
    spec = sampler_spec("stored", {"name": "tpe", "args": {"n_ei_candidates": 20_000}})
    experiment_id = server.hermes.store.submit_experiment("stored", spec, "alice")
    with pytest.raises(SpecError) as refused:
        server.hermes.read_spec(server.hermes.store.experiment(experiment_id))
    assert [field for field, _ in refused.value.problems] == ["search.sampler.args.n_ei_candidates"]


def test_hermes_run_keeps_taking_what_the_server_bounds() -> None:
    """Locally the cost is the user's own: the bounds are the server's alone."""
    sampler = {"optuna": "optuna.samplers.NSGAIISampler", "args": {"population_size": 20_000}}
    spec = parse_spec({**sampler_spec("local", sampler), "trial": {"command": "true"}})
    assert spec.search.sampler_args == {"population_size": 20_000}


# ---------------------------------------------------------------------- what the pages may load
def test_every_answer_forbids_framing_and_other_origins_scripts(server: Server) -> None:
    client = server.client
    answers = [client.get("/"), client.get("/static/app.js"), client.get("/openapi.json"), client.get("/docs"),
               client.get("/api/me"), client.get("/api/me", headers=server.as_("alice")), client.get("/nowhere"),
               client.post("/api/experiments", content=b"x" * (65 * 1024), headers=server.as_("alice"))]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200, 401, 200, 404, 413]
    for answer in answers:
        policy = answer.headers["content-security-policy"]
        directives = dict(directive.strip().partition(" ")[::2] for directive in policy.split(";"))
        assert directives["default-src"] == "'self'" and directives["frame-ancestors"] == "'none'", policy
        assert directives["script-src"].split()[0] == "'self'", policy
        assert "unsafe" not in directives["script-src"] and "*" not in policy, policy
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_docs_load_the_vendored_swagger_ui_and_nothing_from_another_origin(server: Server) -> None:
    """FastAPI's /docs loaded swagger-ui-dist@5 from cdn.jsdelivr.net, unpinned, on the dashboard's origin; /redoc
    redoc@2 alike. /docs now loads the copy under /static, allowed its one inline script by hash; /redoc is gone."""
    answer = server.client.get("/docs")
    page = answer.text
    assert "://" not in page, page  # no URL of another origin, and none of this one spelt whole
    urls = re.findall(r"""(?:src|href)=["']([^"']+)""", page)
    assert any(url.endswith("swagger-ui-bundle.js") for url in urls), urls
    for url in urls:  # relative, so that they resolve under a proxy's path too (test_server_behind_proxy.py)
        assert not url.startswith("/"), url
        assert server.client.get(f"/{url}").status_code == 200, url
    [script] = re.findall(r"<script>(.*?)</script>", page, re.DOTALL)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in answer.headers["content-security-policy"]
    assert server.client.get("/redoc").status_code == 404


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real `hermes server` (one CPU slot) with an admin; its URL and token."""
    directory = tmp_path_factory.mktemp("hardening")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    root = directory / "srv"
    made = subprocess.run([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), "add-user", "ada",
                           "--admin"], capture_output=True, text=True, env=env, check=True)
    give_code(root, "ada")
    port = _free_port()
    with open(directory / "server.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "hermes.cli", "server", "--root", str(root), "--port",
                                    str(port), "--cpu-slots", "1"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for(url)
        yield url, re.search(r"hermes_\S+", made.stdout)[0]  # type: ignore[index]
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no chromium at {CHROMIUM}: apt-get install -y chromium")
def test_in_chromium_the_docs_and_the_dashboard_work_under_the_policy_loading_only_this_origin(
    live_server: tuple[str, str],
) -> None:
    """The policy lets Swagger UI render the API and the dashboard draw its charts and tooltips: the browser reports
    no violation, and every request goes to the server itself."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (test extra)")
    import httpx
    from test_dashboard import launch, signed_in, submit
    from test_server import _until

    url, token = live_server
    experiment_id = submit(url, token, real_spec("ran", trials=2, steps=2))
    _until(lambda: httpx.get(f"{url}/api/experiments/{experiment_id}", headers={"Authorization": f"Bearer {token}"})
           .json()["status"] == "finished", timeout=60)
    requested: list[str] = []
    complaints: list[str] = []
    with playwright.sync_playwright() as p:
        browser = launch(p)
        try:
            docs = browser.new_page()
            docs.on("request", lambda request: requested.append(request.url))
            docs.on("console", lambda message: complaints.append(message.text))
            docs.goto(f"{url}/docs")
            docs.wait_for_selector(".opblock-summary-path[data-path=\"/api/experiments\"]", timeout=15_000)
            errors: list[str] = []
            page = signed_in(browser, url, token, errors)
            page.on("request", lambda request: requested.append(request.url))
            page.on("console", lambda message: complaints.append(message.text))
            page.goto(f"{url}/#/cluster")
            swatch = page.wait_for_selector(".swatch i", timeout=15_000)  # a user's colour, a style attribute
            assert swatch.evaluate("i => getComputedStyle(i).backgroundColor") != "rgba(0, 0, 0, 0)"
            page.evaluate("""() => [...document.querySelectorAll(".chart")].map(echarts.getInstanceByDom).find(Boolean)
                .dispatchAction({type: "showTip", seriesIndex: 0, dataIndex: 0})""")  # its HTML has style attributes
            page.wait_for_timeout(300)
            assert errors == []
        finally:
            browser.close()
    assert [line for line in complaints if "Content Security Policy" in line] == []
    assert {urlsplit(request).netloc for request in requested} == {urlsplit(url).netloc}, requested
