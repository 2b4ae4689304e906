"""Tiny pure-Python trials for the end-to-end tests of ``hermes run`` (tests/test_run.py).

They need no torch: a synthetic learning curve computed from the config, a short sleep per step,
and their state checkpointed with ``hermes.trial.Files``. The specs run them with ``tests`` as the
working directory, so they are ``trials.<module>:<function>``.
"""
