"""A policy or stopper given by a bare name (``policy: hermes``, ``policy.stopper: median``, as ``search.sampler: tpe``)
is a plug-in's ``module:Class`` where it holds a colon: the server refuses it as it refuses one in a mapping, since the
spec's check would import that module in the server's process."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
from test_server import Server, real_spec, server  # noqa: F401  (server: the fixture)


def test_a_bare_plug_in_name_is_refused_as_the_server_would_import_it(
    server: Server, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    refusals = [
        (real_spec("b", policy="this:Policy"), ["body", "spec", "policy"]),
        (real_spec("t", policy={"name": "rr", "stopper": "this:Stopper"}), ["body", "spec", "policy", "stopper"]),
    ]
    for spec, loc in refusals:
        response = server.client.post("/api/experiments", json={"spec": spec}, headers=server.as_("alice"))
        assert response.status_code == 422, (loc, response.text)
        [problem] = response.json()["detail"]
        assert problem["loc"] == loc and "module:Class" in problem["msg"], problem
    assert "The Zen of Python" not in capsys.readouterr().out  # `this` prints it when imported
    assert server.hermes.store.experiments() == []
    accepted = server.client.post("/api/experiments", json={"spec": real_spec("m", policy={"name": "rr", "stopper": "median"})},
                                  headers=server.as_("alice"))
    assert accepted.status_code == 201, accepted.text
