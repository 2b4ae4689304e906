"""The Ray engine (docs/ray.md): ``engine.py`` (``engine: ray``), ``executor.py`` (the driver's side of the
execution contract), ``agent.py`` (one node agent per Ray node with GPUs, hosting the local executor) and
``storage.py`` (durable checkpoints on a storage URI). Ray itself is imported only inside this package, and
only when an experiment uses it, so Hermes runs without it."""
