"""Checks whose work grows with a spec's size: a long choice, a long list of configs, a command line's fillings.

A stored list of 20,000 configs took a minute to check again (each config's value was looked up in the derived
choice one by one), on the pool's thread that answers every user's trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hermes.errors import SpecError
from hermes.experiment import ExperimentSpec, parse_spec
from hermes.experiment.spec import Choice
from hermes.server.area import MAX_FILLINGS, document_problems, spec_problems


class CountedText(str):
    """Text that counts how often it is compared for equality: the work a check does."""

    comparisons = 0

    def __eq__(self, other: object) -> bool:
        CountedText.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def list_spec(configs: list[dict[str, Any]], space: dict[str, Any] | None = None) -> dict[str, Any]:
    search: dict[str, Any] = {"sampler": "list", "configs": configs}
    if space is not None:
        search["space"] = space
    return {"name": "sweep", "trial": {"command": "python train.py", "workdir": "."}, "search": search,
            "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 3}, "storage": {"dir": "runs"}}


def test_a_long_config_list_is_checked_in_linear_work() -> None:
    """As the pool reads the stored spec: the space derived from the configs given with them. Each value was
    compared with every value before it (n²/2 comparisons: 2 million here), now about once."""
    n = 2000
    values = [CountedText(f"v{index}") for index in range(n)]
    stored = list_spec([{"opt": value} for value in values], space={"opt": {"type": "choice", "values": values}})
    CountedText.comparisons = 0
    spec = parse_spec(stored)
    assert CountedText.comparisons < 10 * n
    assert spec.search.space["opt"].values == values and spec.search.trials == n


def test_a_long_choice_is_checked_in_linear_work() -> None:
    n = 2000
    values = [CountedText(f"v{index}") for index in range(n)]
    CountedText.comparisons = 0
    choice = Choice(type="choice", values=values)
    assert all(choice.contains(value) for value in values)
    assert CountedText.comparisons < 10 * n


def test_a_choice_still_tells_values_of_other_types_apart() -> None:
    """1, 1.0 and True are equal in Python, and one value each to Optuna: a choice lists at most one of them, and a
    config's value is one of its values only as written."""
    choice = Choice(type="choice", values=[1, "a", 2.5, False])
    found = {repr(value): choice.contains(value) for value in (1, 1.0, True, 0, False, "a", "1", 2.5, [1])}
    assert found == {"1": True, "1.0": False, "True": False, "0": False, "False": True, "'a'": True, "'1'": False,
                     "2.5": True, "[1]": False}
    for values, problem in (([1, True], "True equals 1"), ([1.0, 1], "1 equals 1.0"), (["x", "y", "x"],
                            "'x' is listed twice")):
        with pytest.raises(ValueError, match=problem):
            Choice(type="choice", values=values)
    with pytest.raises(SpecError, match=r"configs\.1\.lr: 1 is out of search\.space\.lr's values as written"):
        parse_spec(list_spec([{"lr": 1.0}, {"lr": 1}], space={"lr": {"type": "choice", "values": [1.0, 2.0]}}))


# ---------------------------------------------------------------------- the server's check of a command line
def random_spec(values: list[str], command: str) -> ExperimentSpec:
    space = {"a": {"type": "choice", "values": values}}
    return parse_spec({"name": "cmd", "trial": {"command": command, "workdir": "."},
                       "search": {"sampler": "random", "trials": 1, "space": space},
                       "metric": {"name": "score", "mode": "max"}, "budget": {"steps": 3}, "storage": {"dir": "runs"}})


def test_the_fillings_of_a_command_line_are_bounded_in_all_not_per_argument(tmp_path: Path) -> None:
    """A placeholder of 10,000 values in five arguments was 50,000 paths to resolve (9 s, on the thread that takes
    every user's submissions): each argument kept to the limit alone."""
    values = [f"x{index}" for index in range(MAX_FILLINGS // 2)]
    spec = random_spec(values, "python train.py {a} {a} {a}")
    assert spec_problems(spec, tmp_path, tmp_path) == [("trial.command", (
        f"its 5 arguments can be filled in {3 * len(values) + 2} ways in all (argument 2 in {len(values)}), too many "
        f"to check that none names a file outside your area: the server checks {MAX_FILLINGS} at most"))]
    alone = random_spec([f"y{index}" for index in range(MAX_FILLINGS + 1)], "python {a}")
    [(_, problem)] = spec_problems(alone, tmp_path, tmp_path)
    assert problem.startswith(f"its 2 arguments can be filled in more than {MAX_FILLINGS} ways (argument 1 alone)")
    fits = random_spec(values[:100] + ["../outside"], "python train.py {a} --out={a}")
    assert spec_problems(fits, tmp_path, tmp_path) == [
        ("trial.command", "argument 2 ('../outside') leads outside your area on the server"),
        ("trial.command", "argument 3 ('--out=../outside') leads outside your area on the server")]


def test_a_key_the_server_refuses_is_named_in_a_whole_sentence() -> None:
    """The message was cut from the value's ("its name not hold a NUL character", "its name be Unicode text")."""
    problems = document_problems({"description": "ok", "search": {"space": {"a\0b": 1, "c\ud800": 2}}})
    assert problems == [("search.space.a\\x00b", "its name must not hold a NUL character"),
                        ("search.space.c\\ud800",
                         "its name must be Unicode text: it holds a lone surrogate (\\ud800 to \\udfff)")]
