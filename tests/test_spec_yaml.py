"""The spec file's integers: YAML 1.2's forms as YAML 1.2 reads them (0o10 is 8, not the text '0o10'), YAML 1.1's
extra forms (0b11, 1_000, 0x_1F, 1_0.5) still numbers as docs/search.md says, and a form with no digit text, never a
traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from hermes.errors import SpecError
from hermes.experiment import load_spec
from hermes.experiment.spec import read_spec

SPEC = """
    name: y
    trial: {command: "echo {a}", workdir: .}
    search:
      sampler: random
      trials: 0o20
      space:
        a: {type: choice, values: [0o10, 0x1F, 0x, 0o]}
    metric: {name: loss, mode: min}
    budget: {steps: 1}
    resources: {gpus: none, cpu_slots: 1}
    storage: {dir: ./runs}
"""


def test_integers_read_as_the_docs_say(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("a: 0o10\nb: -0o10\nc: 0o8\nd: 0b11\ne: 1_000\nf: 0x_1F\ng: 1_0.5\nh: -0x1F\ni: 010\n"
                    "j: 0x_\nk: 0b_\nl: 0o_\nm: !!int 1_000\n")
    assert read_spec(path) == {"a": 8, "b": -8, "c": "0o8", "d": 3, "e": 1000, "f": 31, "g": 10.5, "h": -31, "i": 10,
                               "j": "0x_", "k": "0b_", "l": "0o_", "m": 1000}


def test_a_spec_file_with_yaml_1_2_octal(tmp_path: Path) -> None:
    """search.trials: 0o20 was the text '0o20' (refused), and a choice's 0o10 reached the trial as '0o10'."""
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(SPEC))
    spec = load_spec(path)
    assert spec.search.trials == 16
    assert spec.search.space["a"].values == [8, 31, "0x", "0o"]


def test_an_int_tag_on_text_is_a_spec_error(tmp_path: Path) -> None:
    """``!!int abc`` raised Python's ValueError, not a SpecError naming the file and the line."""
    path = tmp_path / "spec.yaml"
    path.write_text("a: 1\nb: !!int abc\n")
    with pytest.raises(SpecError) as raised:
        read_spec(path)
    assert str(raised.value) == f"{path}: not valid YAML: line 2: 'abc' is no int"


def test_a_float_tag_on_text_is_a_spec_error(tmp_path: Path) -> None:
    """``!!float abc`` raised Python's ValueError; a float tag on a number still reads it."""
    path = tmp_path / "spec.yaml"
    path.write_text("a: !!float 1_0.5\nb: !!float abc\n")
    with pytest.raises(SpecError) as raised:
        read_spec(path)
    assert str(raised.value) == f"{path}: not valid YAML: line 2: 'abc' is no float"
    path.write_text("a: !!float 1_0.5\nb: !!float .inf\n")
    assert read_spec(path) == {"a": 10.5, "b": float("inf")}


@pytest.mark.parametrize("text", ["'1:30'", "1:30.5", "nan", "infinity", "-.nan", "' 1.5'", "''"])
def test_a_float_tag_on_a_yaml_1_1_only_float_is_a_spec_error(tmp_path: Path, text: str) -> None:
    """``!!float '1:30'`` read as 90.0 (YAML 1.1's base 60) while ``!!int '1:30'`` was refused, and ``!!float ''``
    raised Python's IndexError: a float tag takes YAML 1.2's floats and decimal ints only."""
    path = tmp_path / "spec.yaml"
    path.write_text(f"a: !!float 10\nb: !!float {text}\n")
    with pytest.raises(SpecError) as raised:
        read_spec(path)
    value = text.strip("'")
    assert str(raised.value) == f"{path}: not valid YAML: line 2: {value!r} is no float"


def test_untagged_yaml_1_1_floats_read_as_the_docs_say(tmp_path: Path) -> None:
    """Base 60 is text (YAML 1.1: 90.5); underscores between digits stay a number, as an older Hermes read them."""
    path = tmp_path / "spec.yaml"
    path.write_text("a: 1:30.5\nb: 1_000.5\nc: !!float 1_000\nd: !!float -.INF\ne: 1.\n")
    assert read_spec(path) == {"a": "1:30.5", "b": 1000.5, "c": 1000.0, "d": float("-inf"), "e": 1.0}


@pytest.mark.parametrize(("text", "kind"), [("yes", "bool"), ("off", "bool"), ("n", "bool"), ('"12\\n"', "int")])
def test_a_bool_or_int_tag_takes_only_what_an_untagged_one_reads(tmp_path: Path, text: str, kind: str) -> None:
    """``!!bool yes`` read True while an untagged yes is text (YAML 1.1's booleans), and ``!!int "12\\n"`` read 12
    (a last newline passed the int form's $)."""
    path = tmp_path / "spec.yaml"
    path.write_text(f"a: !!bool TRUE\nb: !!{kind} {text}\n")
    with pytest.raises(SpecError) as raised:
        read_spec(path)
    value = "12\n" if kind == "int" else text
    assert str(raised.value) == f"{path}: not valid YAML: line 2: {value!r} is no {kind}"
    path.write_text("a: !!bool TRUE\nb: !!bool false\nc: !!int 0x1F\n")
    assert read_spec(path) == {"a": True, "b": False, "c": 31}
