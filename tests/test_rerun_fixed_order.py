"""A rerun that only moves a fixed parameter within search.space (``epochs_warmup: 3`` above ``lr``) was refused for
"the order of its parameters", though a fixed parameter takes no draw: Hermes's searchers and Optuna's samplers see
the searched parameters alone, so only their order is what the store compares. A searcher of one's own is given the
whole space, fixed ones in it, so for it every place still counts. A refusal for order names the orders, and no
longer ends with the YAML 1.1 hint, which reads values otherwise, never an order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes.experiment import parse_spec
from hermes.search import make_searcher
from hermes.store import SqlStore, StoreError
from tests.test_run import search, spec_of

LR = {"type": "uniform", "low": 0.1, "high": 0.5}
X = {"type": "int", "low": 1, "high": 9}


def stored_spec(space: dict[str, Any], sampler: str = "random") -> dict[str, Any]:
    return {"name": "ord", "search": {"sampler": sampler, "trials": 4, "seed": 0, "space": space}}


@pytest.fixture
def store(tmp_path: Path) -> SqlStore:
    return SqlStore(f"sqlite:///{tmp_path / 'hermes.db'}")


def test_moving_a_fixed_parameter_continues_the_experiment(store: SqlStore) -> None:
    first = store.create_or_open_experiment("ord", stored_spec({"lr": LR, "x": X, "epochs_warmup": 3}))
    moved = stored_spec({"epochs_warmup": 3, "lr": LR, "warm": "yes", "x": X})  # "warm" added: a fixed one too
    assert store.create_or_open_experiment("ord", moved, may_change=("search.space.warm",)) == first
    assert list(store.experiment(first).spec["search"]["space"]) == ["epochs_warmup", "lr", "warm", "x"]


def test_moving_a_searched_parameter_is_refused_naming_both_orders(store: SqlStore) -> None:
    store.create_or_open_experiment("ord", stored_spec({"lr": LR, "epochs_warmup": 3, "x": X}))
    with pytest.raises(StoreError) as refused:
        store.create_or_open_experiment("ord", stored_spec({"x": X, "epochs_warmup": 3, "lr": LR}))
    message = str(refused.value)
    assert "(differs in search.space (the order of its parameters)); give" in message
    assert message.endswith("; its store orders search.space as lr, x (now x, lr): a spec in that order continues it")
    assert "YAML 1.1" not in message


def test_a_value_refused_beside_an_order_keeps_the_yaml_hint(store: SqlStore) -> None:
    store.create_or_open_experiment("ord", stored_spec({"lr": LR, "x": X}))
    with pytest.raises(StoreError, match=r"differs in search.seed, search.space \(the order of its parameters\)\).*"
                                         r"its store orders search.space as lr, x \(now x, lr\).*YAML 1.1: 010"):
        store.create_or_open_experiment("ord", {**stored_spec({"x": X, "lr": LR}), "search": {
            **stored_spec({"x": X, "lr": LR})["search"], "seed": 1}})


@pytest.mark.parametrize("sampler", ["mine.search:Mine", {"name": "mine.search:Mine"}])
def test_a_searcher_of_ones_own_sees_the_fixed_places_so_they_still_count(store: SqlStore, sampler: Any) -> None:
    spec = stored_spec({"lr": LR, "epochs_warmup": 3})
    spec["search"]["sampler"] = sampler
    store.create_or_open_experiment("ord", spec)
    moved = {**spec, "search": {**spec["search"], "space": {"epochs_warmup": 3, "lr": LR}}}
    with pytest.raises(StoreError, match=r"its store orders search.space as lr, epochs_warmup \(now epochs_warmup, "
                                         r"lr\)"):
        store.create_or_open_experiment("ord", moved)


@pytest.mark.filterwarnings("ignore:QMCSampler is experimental")
@pytest.mark.parametrize("sampler", ["random", "tpe", "qmc"])
def test_where_a_fixed_parameter_stands_changes_no_proposal(sampler: str) -> None:
    """What the store now lets through: the same proposals, whichever place the fixed parameter takes."""
    def proposals(space: dict[str, Any]) -> list[dict[str, Any]]:
        spec = parse_spec(spec_of("ord", search={**search(4, 0, 0.0), "sampler": sampler, "space": space}))
        searcher = make_searcher(spec.search, "max")
        return [searcher.ask().params for _ in range(4)]  # type: ignore[union-attr]  # never None here

    below = proposals({"lr": LR, "x": X, "epochs_warmup": 3})
    assert proposals({"epochs_warmup": 3, "lr": LR, "x": X}) == below
    assert proposals({"lr": LR, "epochs_warmup": 3, "x": X}) == below
