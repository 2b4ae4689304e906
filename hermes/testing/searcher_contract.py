"""The searcher contract suite: proposals within the space, and the determinism rule, on any searcher.

Importable from the package like ``hermes.testing.executor_conformance``, so that a searcher of one's
own runs the tests Hermes's own run. A test module imports the suite and defines the fixture
``search_spec``: the ``search`` section of a spec, as a dict (what ``hermes.experiment.spec.SearchSpec``
validates), whose ``sampler`` names the searcher: a registered name, an Optuna sampler, or a
``BaseSearcher`` of one's own as ``module:Class``::

    import pytest

    from hermes.testing.searcher_contract import *  # noqa: F401,F403

    @pytest.fixture
    def search_spec() -> dict:
        return {
            "sampler": "mypackage.search:Sobol",
            "trials": 12,
            "seed": 3,
            "space": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-1}, "layers": {"type": "int", "low": 1, "high": 4}},
        }

The searcher is made by ``make_searcher`` for a metric to maximise, and driven as a session drives
it: asked while it ``wants_more`` (up to ``trials``, at most 16), told reports and ends in a seeded
interleaving (several trials in flight, some stopped early, one failed). The tests check that

- every proposal sets exactly the parameters of the space, each to a value inside it;
- two fresh searchers told the same calls in the same order propose the same configurations;
- a searcher that says ``learns = False`` proposes the same whatever results it is told.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from hermes.experiment.spec import SearchSpec
from hermes.search import BaseSearcher, make_searcher

__all__ = [
    "search_spec",
    "test_every_proposal_lies_in_the_space",
    "test_the_same_calls_give_the_same_proposals",
    "test_a_searcher_that_does_not_learn_ignores_results",
]

MAX_TRIALS = 16  # enough for a searcher to learn from ends (startup trials), few enough to stay fast
Entry = tuple[Any, ...]  # ("ask", params) | ("report", index, step, value) | ("end", index, value, stopped)


@pytest.fixture
def search_spec() -> dict[str, Any]:
    """Overridden by the importing module."""
    pytest.skip("no search_spec fixture: define one to run the searcher tests")


def validated(search_spec: dict[str, Any]) -> SearchSpec:
    """The section as a spec holds it, checked as a spec is (the sampler is loaded and built)."""
    return SearchSpec.model_validate(search_spec)


def trial_count(search: SearchSpec) -> int:
    return min(search.trials or MAX_TRIALS, MAX_TRIALS)


def result(params: dict[str, Any], step: int, salt: int = 0) -> float:
    """A made-up metric for ``params`` at ``step``: any deterministic function of them will do."""
    return random.Random(f"{salt}:{sorted(params.items())!r}").random() * step / 4


def drive(searcher: BaseSearcher, trials: int, seed: int, salt: int = 0) -> list[Entry]:
    """A session's life in miniature, its calls logged: asks while the searcher wants more (until it has
    nothing more), reports and ends in an interleaving drawn from ``seed``; ``salt`` changes the results."""
    rng, log, steps, params = random.Random(seed), [], {}, {}
    exhausted = False
    while (searcher.asked < trials and not exhausted) or steps:
        may_ask = searcher.asked < trials and not exhausted and searcher.wants_more
        if may_ask and (not steps or rng.random() < 0.4):
            config = searcher.ask()
            log.append(("ask", None if config is None else config.params))
            if config is None:
                exhausted = True
            else:
                steps[config.index], params[config.index] = 0, config.params
            continue
        index = rng.choice(sorted(steps))
        if steps[index] < 3 and rng.random() < 0.7:
            steps[index] += 1
            entry: Entry = ("report", index, steps[index], result(params[index], steps[index], salt))
        elif index == 1:
            entry = ("end", index, None, False)  # failed
        else:
            entry = ("end", index, result(params[index], steps[index], salt), steps[index] < 3)  # maybe stopped early
        log.append(entry)
        tell(searcher, entry)
        if entry[0] == "end":
            del steps[index]
    return log


def tell(searcher: BaseSearcher, entry: Entry) -> None:
    if entry[0] == "report":
        searcher.on_report(*entry[1:])
    elif entry[0] == "end":
        searcher.on_end(entry[1], entry[2], stopped=entry[3])


def replay(searcher: BaseSearcher, log: list[Entry]) -> list[dict[str, Any] | None]:
    """The same calls, in the same order, on ``searcher``; what each ask proposed."""
    proposed: list[dict[str, Any] | None] = []
    for entry in log:
        if entry[0] == "ask":
            config = searcher.ask()
            proposed.append(None if config is None else config.params)
        else:
            tell(searcher, entry)
    return proposed


def asked(log: list[Entry]) -> list[dict[str, Any] | None]:
    return [entry[1] for entry in log if entry[0] == "ask"]


def assert_same_proposals(
    got: list[dict[str, Any] | None], expected: list[dict[str, Any] | None], log: list[Entry], what: str
) -> None:
    """Fail naming the first proposal that differs and the call of ``log`` that asked for it: pytest does not
    rewrite the asserts of an imported module, so a bare comparison said nothing."""
    if got == expected:
        return
    index = next((i for i, pair in enumerate(zip(got, expected)) if pair[0] != pair[1]), min(len(got), len(expected)))
    calls = [number for number, entry in enumerate(log, 1) if entry[0] == "ask"]
    where = f"ask {index + 1}" + (f" (call {calls[index]} of {len(log)})" if index < len(calls) else "")

    def proposal(proposals: list[dict[str, Any] | None]) -> str:
        return repr(proposals[index]) if index < len(proposals) else "no ask: the proposals end here"

    raise AssertionError(f"{what}: {where} differs first\n"
                         f"  expected: {proposal(expected)}\n  got:      {proposal(got)}")


# ---------------------------------------------------------------------------------------- the tests
def test_every_proposal_lies_in_the_space(search_spec: dict[str, Any]) -> None:
    search = validated(search_spec)
    proposals = [params for params in asked(drive(make_searcher(search, "max"), trial_count(search), 1)) if params]
    assert proposals, "the searcher proposed nothing"
    for params in proposals:
        assert set(params) == set(search.space), f"{params} does not set exactly the parameters {list(search.space)}"
        for name, value in params.items():
            assert search.space[name].contains(value), f"{name}={value!r} is outside {search.space[name]}"


def test_the_same_calls_give_the_same_proposals(search_spec: dict[str, Any]) -> None:
    search = validated(search_spec)
    trials = trial_count(search)
    for seed in (1, 2):  # two interleavings of asks, reports and ends
        log = drive(make_searcher(search, "max"), trials, seed)
        assert any(entry[0] == "end" for entry in log) and any(entry[0] == "report" for entry in log)
        assert_same_proposals(replay(make_searcher(search, "max"), log), asked(log), log,
                              f"a fresh searcher told the same calls (interleaving {seed}) proposed otherwise")


def test_a_searcher_that_does_not_learn_ignores_results(search_spec: dict[str, Any]) -> None:
    search = validated(search_spec)
    if make_searcher(search, "max").learns:
        pytest.skip("the searcher learns from results (learns = True)")
    trials = trial_count(search)
    log = drive(make_searcher(search, "max"), trials, seed=1)
    other_log = drive(make_searcher(search, "max"), trials, seed=2, salt=1)  # other results, in another order
    untold = make_searcher(search, "max")
    never_told = [None if (config := untold.ask()) is None else config.params for _ in asked(log)]
    assert_same_proposals(asked(log), never_told, log, "told results, it proposed otherwise than told none")
    assert_same_proposals(asked(other_log), never_told, other_log,
                          "told other results, it proposed otherwise than told none")
