"""The first-report duration model: it learns how hyper-parameters set an epoch's length, and
says so only when held-out trials confirm it."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.policies.duration import DurationModel


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


def test_learns_a_size_and_a_choice_and_ranks_unseen_trials() -> None:
    rng = np.random.default_rng(0)
    model = DurationModel()
    widths = rng.integers(16, 1024, 200)
    optimisers = rng.choice(["sgd", "adam"], 200)
    seconds = 0.05 * widths * np.where(optimisers == "adam", 1.5, 1.0) * rng.lognormal(0.0, 0.1, 200)
    items = [model.add({"optimizer": str(o), "width": int(w), "seed": 7}) for w, o in zip(widths, optimisers)]
    assert model.fit(items[:40], seconds[:40].tolist())
    predicted = model.predict(items[40:])
    assert spearman(predicted, seconds[40:]) > 0.9
    assert np.median(np.abs(np.log(predicted / seconds[40:]))) < 0.2  # within about 20%


def test_no_trust_when_durations_do_not_follow_the_parameters() -> None:
    rng = np.random.default_rng(1)
    model = DurationModel()
    items = [model.add({"lr": float(lr), "layers": int(n)}) for lr, n in zip(rng.uniform(0, 1, 60), rng.integers(1, 5, 60))]
    assert not model.fit(items, rng.uniform(10, 60, 60).tolist())
    assert not model.trusted
    with pytest.raises(RuntimeError):
        model.predict(items)


def test_needs_enough_measured_trials_and_some_parameters() -> None:
    model = DurationModel(least=10)
    items = [model.add({"width": w}) for w in range(1, 30)]
    assert not model.fit(items[:9], [float(w) for w in range(1, 10)])  # below least
    assert model.fit(items[:12], [float(w) for w in range(1, 13)])
    bare = DurationModel()
    assert not bare.fit([bare.add({}) for _ in range(20)], [float(i + 1) for i in range(20)])


def test_a_column_that_turns_out_categorical_and_missing_values() -> None:
    """Numbers then a string in one column: all its values become categories; absent values are allowed."""
    model = DurationModel()
    items = [model.add({"kind": 1}) for _ in range(10)] + [model.add({"kind": "big"}) for _ in range(10)]
    items += [model.add({"other": 3.0}) for _ in range(4)]  # "kind" absent
    items.append(model.add({"other": float("nan")}))  # not a category: an absent number
    seconds = [10.0] * 10 + [100.0] * 10 + [10.0] * 5
    assert model.fit(items, seconds)
    small, big, absent = model.predict([items[0], items[10], items[20]])
    assert big > 3 * small and big > 3 * absent
    assert model._numeric[model._columns["other"]]


def test_values_near_the_float_limit_leave_their_logarithm_to_learn_from() -> None:
    """A parameter of 1e308 overflowed the spread of its column: the fit failed in an SVD, ending the run."""
    rng = np.random.default_rng(3)
    model = DurationModel()
    big = rng.choice([1.0, 1e308], 60)
    seconds = np.where(big > 1, 30.0, 10.0) * rng.lognormal(0.0, 0.05, 60)
    items = [model.add({"x": float(x)}) for x in big]
    assert model.fit(items[:40], seconds[:40].tolist())
    assert np.median(np.abs(np.log(model.predict(items[40:]) / seconds[40:]))) < 0.1


def test_an_int_beyond_a_float_is_a_category_to_learn_from() -> None:
    """``float(10**400)`` raised OverflowError in the default policy's first priority, failing every run of a
    search whose space held such an int."""
    rng = np.random.default_rng(4)
    model = DurationModel()
    sizes = rng.choice([10**400, 10**401], 60)
    seconds = np.where(sizes == 10**401, 30.0, 10.0) * rng.lognormal(0.0, 0.05, 60)
    items = [model.add({"n": int(n)}) for n in sizes]
    assert model.fit(items[:40], seconds[:40].tolist())
    assert np.median(np.abs(np.log(model.predict(items[40:]) / seconds[40:]))) < 0.1
