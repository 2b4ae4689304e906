"""Benchmarks. A package so that ``bench.frameworks.workload:hermes_trial`` imports from the repository root."""
