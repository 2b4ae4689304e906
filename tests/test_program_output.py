"""What an unmodified program prints, and where it writes: a long line is searched at its end only and in time that
does not grow with its length, `{trial_dir}` gives each trial a folder of its own beside the shared working directory,
a comma the pattern writes after the step group separates fields, and the spec check's advice for a metric whose name
is no group's compiles. Real runs (``hermes run``, ``hermes.run``), real processes, the real store."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import hermes
from hermes.core.states import TrialState
from hermes.errors import SpecError
from hermes.experiment import parse_spec
from hermes.experiment.command import CommandError, command_argv, parse_template
from hermes.local.launchers.process import SEARCHED
from tests.test_run import hermes as hermes_cli
from tests.test_run import load_view, spec_of, write_spec
from tests.test_scripts import program_spec

# ---------------------------------------------------------------------- 1. long lines
LONG_LINES = ("import sys\n"
              "fills = ['.' * 100_000, '1' * 100_000, '.' * 3_000_000]  # a dot (or a digit) per batch, no line end\n"
              "for epoch, fill in enumerate(fills, 1):\n"
              "    sys.stdout.write(fill)\n"
              "    print(f' {epoch}/3 accuracy {epoch / 10}', flush=True)\n")


def test_a_long_line_is_searched_at_its_end_without_freezing_the_runner(tmp_path: Path) -> None:
    """Before, each whole line (up to 1 MiB) was searched in the runner's thread: a pattern led by ``.*?``, as the
    trial's own error message advises, took time in the square of the line's length, minutes for these lines (19 s
    for 60 KB), while no other trial was looked after. Now only a line's last SEARCHED characters are searched, and
    a pattern led by ``.*?`` is tried at their start only: the run takes its usual second or two."""
    path = program_spec(tmp_path, "dots", LONG_LINES, r".*?(?P<step>\d+)/3 accuracy (?P<value>\S+)", 3)
    result = hermes_cli("run", str(path), "--no-live", cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert [(record.step, record.values["value"]) for record in view.metrics] == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_a_number_cut_by_the_start_of_the_searched_end_fails_the_trial_saying_so(tmp_path: Path) -> None:
    """A group that reads from where the searched end of a long line starts, inside a number, read only its end."""
    program = "print('0.' + '1' * 20000 + ' items')\n"
    hermes.run(program_spec(tmp_path, "cut", program, r"(?P<value>[\d.]+) items", 1))
    view, _ = load_view(tmp_path / "runs")
    ones = "1" * (SEARCHED - len(" items"))
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.FAILED, (
        f"trial.metrics_regex's group 'value' read '{ones}' in the last {SEARCHED} characters of a line of 20008, "
        f"'{ones} items', where the number begins before the last {SEARCHED} characters of the line, all of a longer "
        "line that is searched: print the metrics at the end of their line, or on a line of their own"))]


PER_CLASS = ("for epoch in range(1, 4):\n"
             "    classes = ' | '.join(f'class_{c:02d} accuracy 0.{c:04d}' for c in range(40))  # 1,300 characters\n"
             "    print(f'epoch {epoch} accuracy 0.{epoch + 5} | {classes}', flush=True)\n"
             "print('x' * 20000, flush=True)  # a line longer than what is searched, said once in stderr.log\n")


def test_a_metrics_line_of_a_few_thousand_characters_is_read_where_its_first_match_is(tmp_path: Path) -> None:
    """The overall accuracy, then each class's, on one line of 1,300 characters: with 1,024 characters searched, each
    epoch recorded class 12's accuracy (0.0012), a wrong best with no word said. A line longer than what is searched
    is said once in the trial's stderr.log."""
    hermes.run(program_spec(tmp_path, "perclass", PER_CLASS, r"accuracy (?P<value>\d\.\d+)", 3))
    view, _ = load_view(tmp_path / "runs")
    assert [(record.step, record.values["value"]) for record in view.metrics] == [(1, 0.6), (2, 0.7), (3, 0.8)]
    [log] = (tmp_path / "runs").glob("*/trials/*/stderr.log")
    assert log.read_text().count(f"a line of 20000 characters was searched in its last {SEARCHED} only") == 1


@pytest.mark.parametrize("pattern", [r".*?x(?P<value>\S+)", r".+(?P<value>\d)x", r"(?P<step>\d+).*?x(?P<value>\S*)",
                                     r"(?i)\D*(?P<value>\d+)X", r"[^x]+?(?P<value>x\d)", r"(?P<step>\d+)x(?P=step)",
                                     r"(?x) [\d.]+ x (?P<value> \d )", r"[\]\-a-c]+(?P<value>\d)x", r"(?s).*?x(?P<value>7)",
                                     r"[^\d\s]*(?P<value>\d)x", r"\s*(?P<value>\d)x", r"(?:\w+?)x(?P<value>\d)"])
def test_the_search_of_a_line_finds_what_a_plain_search_of_its_end_finds(pattern: str) -> None:
    """A pattern led by a repeat of one class is tried only where a match can start: what it reads is unchanged."""
    from hermes.local.launchers.process import _search

    compiled = re.compile(pattern)
    for text in ["", "x", "12x3", "ab12x12x3.", "..1x1 22x22 x9", " a]-1x b-2x", "7" * 20000 + "x7", "a1x" * 6000]:
        start = max(0, len(text) - SEARCHED)
        expected, found = compiled.search(text, start), _search(compiled, text, start)
        assert (found and (found.span(), found.groupdict())) == (expected and (expected.span(), expected.groupdict()))


@pytest.mark.parametrize(("pattern", "text"), [
    (r"(?x) .*? step \s (?P<step>\d+) \s acc \s (?P<value>[\d.]+)  # step, then accuracy", "step 3 acc 0.5"),
    (r"(?a).*?step (?P<step>\d+) loss (?P<value>\d+)", "step \u0663 loss 5 step 3 loss 7"),
    (r"(?a).*?epoch\s*[[(](?P<step>\d+)\D+(?P<value>[\d.]+)", "epoch [3] acc 0.5"),
    (r"(?ix)\s* ACC [=:] (?P<value>\d) # a comment", "x acc=4"),
])
def test_flags_of_a_pattern_led_by_a_repeat_read_as_python_reads_them(pattern: str, text: str) -> None:
    """A comment ending a verbose pattern took in the close of the group that guards its lead (the pattern did not
    compile: the runner, or a server's pool, stopped at the first line), and re's ASCII flag was regex's VERSION1
    (Unicode digits, sets of another syntax)."""
    from hermes.local.launchers.process import _search

    compiled = re.compile(pattern)
    expected, found = compiled.search(text), _search(compiled, text, 0)
    assert expected is not None and found is not None
    assert (found.span(), found.groupdict()) == (expected.span(), expected.groupdict())


# ---------------------------------------------------------------------- 2. {trial_dir}
LEGACY = ("import argparse, json, os, sys\n"
          "parser = argparse.ArgumentParser()  # a legacy trainer: it resumes from its own checkpoint if it finds one\n"
          "parser.add_argument('--lr', type=float)\n"
          "parser.add_argument('--save_dir')\n"
          "args = parser.parse_args()\n"
          "print(json.dumps([os.getcwd(), args.save_dir, os.environ['HERMES_TRIAL_DIR']]), file=sys.stderr)\n"
          "path = os.path.join(args.save_dir, 'ckpt.json')\n"
          "epoch, accuracy = json.load(open(path)) if os.path.exists(path) else (0, 0.0)\n"
          "for epoch in range(epoch + 1, 4):\n"
          "    accuracy = 1 - (1 - accuracy) * (1 - args.lr)\n"
          "    json.dump([epoch, accuracy], open(path, 'w'))\n"
          "    print(f'epoch {epoch} accuracy {accuracy:.4f}', flush=True)\n")


def test_trial_dir_gives_each_trial_its_own_folder_in_the_shared_working_directory(tmp_path: Path) -> None:
    """Every trial runs in trial.workdir, so a program's ./ckpt.json was every trial's: the second trial resumed from
    the first's and recorded its results. ``{trial_dir}`` (refused before: no such parameter) is the trial's own
    folder, the one HERMES_TRIAL_DIR names; the program still runs in the workdir."""
    (tmp_path / "program.py").write_text(LEGACY)
    path = write_spec(tmp_path, spec_of(
        "legacy",
        trial={"command": f"{sys.executable} program.py --lr {{lr}} --save_dir {{trial_dir}}",
               "workdir": str(tmp_path), "metrics_regex": r"epoch (?P<step>\d+) accuracy (?P<value>\S+)"},
        search={"sampler": "list", "configs": [{"lr": 0.1}, {"lr": 0.2}]},
        metric={"name": "accuracy", "mode": "max"},
        budget={"steps": 3},
        policy={"name": "fifo"},
        resources={"gpus": "none", "cpu_slots": 1},
    ))
    hermes.run(path)
    view, _ = load_view(tmp_path / "runs")
    assert [trial.state for trial in view.trials] == [TrialState.COMPLETED] * 2
    lrs = {trial.trial_id: trial.params["lr"] for trial in view.trials}
    expected = {0.1: [0.1, 0.19, 0.271], 0.2: [0.2, 0.36, 0.488]}
    for trial_id, lr in lrs.items():
        assert [record.values["value"] for record in view.metrics if record.trial_id == trial_id] == expected[lr]
        folder = (tmp_path / "runs" / "legacy" / "trials" / trial_id).resolve()
        cwd, save_dir, environment = json.loads((folder / "stderr.log").read_text().splitlines()[0])
        assert (cwd, save_dir, environment) == (str(tmp_path.resolve()), str(folder), str(folder))
        assert (folder / "ckpt.json").is_file()
    assert not (tmp_path / "ckpt.json").exists()


def test_a_parameter_named_trial_dir_fills_its_placeholder_and_no_template_holds_the_mark() -> None:
    assert command_argv("train --out {trial_dir}", {"trial_dir": "mine"}) == ("train", "--out", "mine")
    with pytest.raises(CommandError, match="NUL"):  # the mark of {trial_dir} holds one: no template can
        parse_template("train \0trial_dir\0")


# ---------------------------------------------------------------------- 3. a comma after the step group
CSV = "print('epoch,correct')\nfor epoch, correct in [(1, 873), (2, 912), (3, 934)]:\n    print(f'{epoch},{correct}')\n"


def test_a_comma_the_pattern_writes_after_the_step_group_separates_fields(tmp_path: Path) -> None:
    """Before, ``1,873`` failed the trial as step 1 of a number with thousands, advising a pattern that would read
    step 1873, far past budget.steps."""
    hermes.run(program_spec(tmp_path, "csv", CSV, r"^(?P<step>\d+),(?P<value>\d+)$", 3))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.COMPLETED, None)]
    assert [(record.step, record.values["value"]) for record in view.metrics] == [(1, 873), (2, 912), (3, 934)]


def test_a_step_group_cut_before_thousands_is_told_to_be_left_out_not_read_whole(tmp_path: Path) -> None:
    r"""Where the comma is not the pattern's own (``\s*,``), ``1,873`` may be a step of thousands: a step counts
    epochs, so the advice is to leave the step group out, or to write the comma after it."""
    hermes.run(program_spec(tmp_path, "csv", CSV, r"^(?P<step>\d+)\s*,\s*(?P<value>\d+)$", 3))
    view, _ = load_view(tmp_path / "runs")
    assert [(trial.state, trial.error) for trial in view.trials] == [(TrialState.FAILED, (
        "trial.metrics_regex's group 'step' read '1' in the line '1,873', where the number goes on (1,873): a step "
        "written with thousands counts iterations, not the epochs budget.steps counts; leave the step group out, and "
        "each matching line is the next step, or write the comma in the pattern right after the group if it "
        "separates fields"))]


# ---------------------------------------------------------------------- 4. a metric no group can be named after
def test_the_group_suggested_for_a_metric_whose_name_is_no_identifier_compiles() -> None:
    """Before, metric ``val-acc`` was told to write ``(?P<val-acc>...)``, which does not compile."""
    spec = spec_of("dashed", trial={"command": "train {rate}", "metrics_regex": r"val-acc (\S+)"},
                   metric={"name": "val-acc", "mode": "max"})
    with pytest.raises(SpecError) as refused:
        parse_spec(spec)
    message = str(refused.value)
    assert "needs a named group for the metric: (?P<value>...), which reads 'val-acc'" in message
    for suggested in re.findall(r"\(\?P<[^>]*>\.\.\.\)", message):
        re.compile(suggested.replace("...", r"\S+"))
    parse_spec({**spec, "trial": {**spec["trial"], "metrics_regex": r"val-acc (?P<value>\S+)"}})  # as suggested
