"""What to tune and how: the YAML experiment spec and the configurations it generates."""

from __future__ import annotations

from hermes.experiment.space import (
    Config,
    FixedSampler,
    Sampler,
    TpeSampler,
    make_sampler,
    sample_configs,
)
from hermes.experiment.spec import ExperimentSpec, load_spec, parse_spec

__all__ = [
    "Config",
    "ExperimentSpec",
    "FixedSampler",
    "Sampler",
    "TpeSampler",
    "load_spec",
    "make_sampler",
    "parse_spec",
    "sample_configs",
]
