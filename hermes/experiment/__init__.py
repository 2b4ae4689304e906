"""What to tune and how: the YAML experiment spec (the configurations come from ``hermes.search``)."""

from __future__ import annotations

from hermes.experiment.spec import ExperimentSpec, load_spec, parse_spec

__all__ = ["ExperimentSpec", "load_spec", "parse_spec"]
