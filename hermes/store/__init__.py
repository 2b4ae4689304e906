"""Durable record of experiments: the core's event log, decisions, trials and metrics."""

from __future__ import annotations

from hermes.store.base import (
    DecisionRecord,
    ExperimentRecord,
    ExperimentStatus,
    ExperimentStore,
    MetricRecord,
    NameTaken,
    Run,
    RunTimeline,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TooManyExperiments,
    TrialRecord,
    WriterLost,
    build_runs,
)
from hermes.store.sql import SqlStore

__all__ = [
    "DecisionRecord",
    "ExperimentRecord",
    "ExperimentStatus",
    "ExperimentStore",
    "MetricRecord",
    "NameTaken",
    "Run",
    "RunTimeline",
    "SqlStore",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "TooManyExperiments",
    "TrialRecord",
    "WriterLost",
    "build_runs",
]
