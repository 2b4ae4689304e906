"""Hermes as a shared service: `hermes server` runs the REST API (FastAPI on uvicorn) and the web dashboard.

- ``app``: the application (store, accounts, the fair-share pool that runs the experiments, body limit,
  static dashboard);
- ``api``: the routes under /api, documented by OpenAPI at /docs;
- ``auth``: users and hashed API tokens;
- ``config``: the server's settings (its root, store, resources), which the account commands read alone;
- ``digest``: each experiment's dashboard state, followed incrementally from the store;
- ``client``: the store of a remote server, for `hermes submit/status/results/plot --server`;
- ``static``: the dashboard (plain JavaScript, vendored uPlot and ECharts with their licences).

FastAPI and uvicorn are imported only here (the ``server`` extra).
"""
