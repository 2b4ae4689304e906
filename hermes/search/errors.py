"""The error a wrong sampler in the spec raises, naming its field below ``search``."""

from __future__ import annotations

from hermes.errors import SpecError


class SamplerError(SpecError):
    """``field`` is relative to ``search`` (e.g. ``sampler.args``), so the spec can place it in its own path."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"search.{field}: {reason}")
        self.field = field
        self.reason = reason
