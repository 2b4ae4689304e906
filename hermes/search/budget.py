"""How many trials an experiment may ask for: a count, a wall-clock time, GPU hours, whichever ends first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes.experiment.spec import SearchSpec

BUDGET_FIELDS = ("trials", "max_time", "max_gpu_hours")  # the search fields a rerun may change


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits on asking new trials; None: no limit of that kind.

    The budget gates proposals only: trials already asked keep running until they end (the policy
    may stop them). Time is the session's, from the engine's clock, so that a replay decides alike.
    """

    trials: int | None = None
    seconds: float | None = None  # wall-clock seconds since the experiment started
    gpu_seconds: float | None = None  # GPU (or slot) seconds used by all trials together

    @classmethod
    def of(cls, search: SearchSpec) -> Budget:
        hours = search.max_gpu_hours
        return cls(search.trials, search.max_time, None if hours is None else hours * 3600.0)

    def may_ask(self, asked: int, elapsed: float, gpu_seconds: float) -> bool:
        """Whether another trial may be asked, after ``asked`` trials, ``elapsed`` seconds and ``gpu_seconds`` used."""
        return (
            (self.trials is None or asked < self.trials)
            and (self.seconds is None or elapsed < self.seconds)
            and (self.gpu_seconds is None or gpu_seconds < self.gpu_seconds)
        )


def without_budget(spec_json: dict[str, Any]) -> dict[str, Any]:
    """A stored spec (``model_dump(mode="json")``) minus the budget fields: two specs that are equal
    this way describe the same experiment, one of them extended or shortened."""
    search = {key: value for key, value in spec_json.get("search", {}).items() if key not in BUDGET_FIELDS}
    return {**spec_json, "search": search}
