"""Command templates: split into words first, then filled, so a value is never more than its word."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import pytest

from hermes.errors import HermesError
from hermes.experiment.command import CommandError, command_argv, parse_template, validate_template

ECHO = f"{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))'"


def received(argv: tuple[str, ...]) -> list[str]:
    """What a real child process gets as its arguments."""
    return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout)


def test_each_value_stays_inside_its_word_in_a_real_process() -> None:
    params = {"name": "it's", "evil": "a b --evil=1", "quoted": '"x" \'y\'', "empty": "", "lr": 0.001}
    template = ECHO + " --name {name} --opt={evil} {quoted} {empty} 'lr {lr}' pre{lr}post {{literal}}"
    assert received(command_argv(template, params)) == [
        "--name", "it's", "--opt=a b --evil=1", '"x" \'y\'', "", "lr 0.001", "pre0.001post", "{literal}",
    ]


def test_no_shell_ever_runs(tmp_path) -> None:
    marker = tmp_path / "pwned"
    argv = command_argv(ECHO + " {x}", {"x": f"; touch {marker}; $(touch {marker})"})
    assert received(argv) == [f"; touch {marker}; $(touch {marker})"]
    assert not marker.exists()


def test_placeholders_in_order_of_first_use() -> None:
    assert parse_template("train --b {b} --a {a} --again {b}{a}").placeholders == ("b", "a")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("train --x {x:>99999999}", "{x:>99999999}: format specs are not allowed"),
        ("train --x {x:d}", "{x:d}: format specs are not allowed"),
        ("train --x {x!r}", "{x!r}: conversions are not allowed"),
        ("train --x {x.__class__}", "{x.__class__}: attribute access is not allowed"),
        ("train --x {x[0]}", "{x[0]}: index access is not allowed"),
        ("train --x {0}", "{0}: placeholders must name a parameter"),
        ("train --x {}", "{}: placeholders must name a parameter"),
        ("train --x '{x y}'", "{x y}: placeholders must name a parameter"),
        ("train --x {x y}", "unclosed placeholder in '{x'"),
        ("train --x x}", "single '}' in 'x}'"),
        ("train --name it's", "cannot parse \"train --name it's\": no closing quotation"),
        ("train \\", "cannot parse"),
        ("   ", "must not be empty"),
    ],
)
def test_broken_templates_are_refused_quickly_with_the_reason(template: str, message: str) -> None:
    start = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(CommandError) as raised:
            parse_template(template)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(raised.value).startswith(message)
    assert isinstance(raised.value, HermesError)
    assert peak < 1_000_000  # {x:>99999999} is never formatted: that makes a string of 100 MB
    assert time.monotonic() - start < 2.0  # nothing hangs (a bound a loaded machine keeps; the above is exact)


def test_validate_template_names_the_unknown_placeholder() -> None:
    assert validate_template("train {lr} {width}", ["lr", "width"]).placeholders == ("lr", "width")
    with pytest.raises(CommandError, match=r"placeholder \{depth\} is not in search.space \(parameters: lr\)"):
        validate_template("train {lr} {depth}", ["lr"])


def test_a_missing_or_unrepresentable_value_is_an_error_not_a_traceback() -> None:
    with pytest.raises(CommandError, match=r"placeholder \{width\} has no value \(parameters: lr\)"):
        command_argv("train {lr} {width}", {"lr": 0.1})
    with pytest.raises(CommandError, match="NUL character"):
        command_argv("train {name}", {"name": "a\0b"})
