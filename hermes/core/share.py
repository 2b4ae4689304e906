"""Fair shares of a GPU pool: weighted water-filling, flat or by user then experiment.

Pure arithmetic over plain values, kept apart from the pool scheduler so that the rule that
decides who is owed what can be read (and tested) on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Key = TypeVar("Key")

_EPSILON = 1e-12
# Weights are ratios: a million to one is more than a team needs, and their sums stay far from overflow.
MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6


def water_fill(capacity: float, weights: Mapping[Key, float], caps: Mapping[Key, float]) -> dict[Key, float]:
    """Divide ``capacity`` in proportion to ``weights``, none above its cap (its demand).

    What a capped member cannot use goes to the others, in proportion to their weights, so
    nothing is left idle while someone could use it (max-min fairness with weights). Keys are
    visited in their mapping order, which fixes the floating-point sums. Only the weights' ratios
    count: they are taken relative to the largest, so that no sum of them overflows."""
    rates = dict.fromkeys(weights, 0.0)
    top = max(weights.values(), default=0.0)
    weights = {key: weight / top for key, weight in weights.items()} if top > 0 else weights
    open_keys = [key for key in weights if caps[key] > 0 and weights[key] > 0]
    left = capacity
    while open_keys and left > _EPSILON:
        total = sum(weights[key] for key in open_keys)
        capped = [key for key in open_keys if caps[key] - rates[key] <= left * weights[key] / total + _EPSILON]
        if not capped:
            for key in open_keys:
                rates[key] += left * weights[key] / total
            break
        for key in capped:
            left -= caps[key] - rates[key]
            rates[key] = caps[key]
        open_keys = [key for key in open_keys if key not in capped]
    return rates


def nested_shares(
    capacity: float,
    owners: Mapping[Key, str],
    weights: Mapping[Key, float],
    demands: Mapping[Key, float],
    owner_weights: Mapping[str, float],
) -> dict[Key, float]:
    """GPUs per experiment: the pool divided between owners by their weights (default 1), then
    each owner's part between their experiments by the experiments' weights, all capped by demand."""
    by_owner: dict[str, list[Key]] = {}
    for key in weights:
        by_owner.setdefault(owners[key], []).append(key)
    owner_caps = {owner: sum(demands[key] for key in keys) for owner, keys in by_owner.items()}
    owner_rates = water_fill(capacity, {owner: owner_weights.get(owner, 1.0) for owner in by_owner}, owner_caps)
    shares: dict[Key, float] = {}
    for owner, keys in by_owner.items():
        shares.update(water_fill(owner_rates[owner], {key: weights[key] for key in keys}, demands))
    return {key: shares[key] for key in weights}
