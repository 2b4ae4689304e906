"""The errors of samplers: a wrong one in the spec, naming its field below ``search``; one that fails while searching."""

from __future__ import annotations

from hermes.errors import HermesError, SpecError


class SamplerError(SpecError):
    """``field`` is relative to ``search`` (e.g. ``sampler.args``), so the spec can place it in its own path."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"search.{field}: {reason}")
        self.field = field
        self.reason = reason


class SamplerFailed(HermesError):
    """A sampler raised while proposing or learning (an Optuna sampler is anyone's code): the experiment ends failed."""
