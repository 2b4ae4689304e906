"""The Ray engine's groundwork: durable checkpoint storage (``storage.py``). Ray itself is imported
only inside this package, and lazily, so Hermes runs without it."""
