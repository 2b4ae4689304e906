"""Hermes: a preemptive, convergence-aware GPU scheduler for hyper-parameter optimisation."""

from __future__ import annotations

__version__ = "0.1.0"
