"""Hermes against FIFO, Ray Tune's ASHA and Optuna's pruners on one real workload (``compare.py``)."""
