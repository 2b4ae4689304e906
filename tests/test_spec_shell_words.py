"""Shell syntax in a spec, which no shell reads: a path's ``$HOME`` and a command's ``> out.log``, ``$HOME``, ``~`` or
``&&`` were taken as literal text without a word (a folder named ``$HOME`` beside the spec, arguments the program did
not expect); and the policy's period, which refused a duration the other time fields take and lost to
``params.period`` silently."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.errors import SpecError
from hermes.experiment import load_spec
from hermes.experiment.command import command_argv

ROOT = Path(__file__).resolve().parent.parent
ARGV = "import sys; print(sys.argv[1:]); print('epoch 1 acc 0.5')"  # a program that shows what it was given


def write_spec(directory: Path, **sections: Any) -> Path:
    spec = {
        "name": "shell",
        "trial": {"command": "python3 -c {program}", "metrics_regex": r"epoch (?P<step>\d+) acc (?P<value>\S+)"},
        "search": {"trials": 1, "space": {"program": ARGV, "lr": {"type": "choice", "values": [0.1]}}},
        "metric": {"name": "acc", "mode": "max"},
        "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 1},
        **sections,
    }
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def command_spec(directory: Path, command: str) -> Path:
    return write_spec(directory, trial={"command": command, "metrics_regex": r"acc (?P<value>\S+)"})


def test_hermes_run_refuses_a_variable_in_storage_dir_and_makes_no_folder_of_it(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, storage={"dir": "$HOME/hermes-runs"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "hermes.cli", "run", str(spec), "--no-live"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stderr
    assert "storage.dir: '$HOME/hermes-runs' holds $HOME" in run.stderr
    assert "Hermes does not expand environment variables: write the path out" in run.stderr
    assert list(tmp_path.iterdir()) == [spec]  # no folder named $HOME beside it


@pytest.mark.parametrize(("field", "written", "variable"), [
    ("storage.dir", "${HOME}/runs", "${HOME}"),
    ("storage.dir", "runs/$USER", "$USER"),
    ("trial.workdir", "$PWD", "$PWD"),
])
def test_a_path_with_a_variable_is_refused_naming_its_field_and_a_leading_tilde_is_the_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str, written: str, variable: str) -> None:
    section, key = field.split(".")
    sections = {"trial": {"command": "python3 -c {program}", "metrics_regex": r"acc (?P<value>\S+)", key: written}}
    with pytest.raises(SpecError) as refused:
        load_spec(write_spec(tmp_path, **(sections if section == "trial" else {section: {key: written}})))
    message = (f"{written!r} holds {variable}, an environment variable, but Hermes does not expand environment "
               "variables: write the path out (a leading ~ is your home)")
    assert refused.value.problems == [(field, message)]
    home = tmp_path / "home"
    (home / "code").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))  # what to write instead
    spec = load_spec(write_spec(tmp_path, storage={"dir": "~/runs"},
                                trial={"command": "python3 -c {program}", "workdir": "~/code"}))
    assert (spec.storage_dir, spec.workdir) == (home / "runs", home / "code")


@pytest.mark.parametrize(("command", "word"), [
    ("python3 -c {program} --lr {lr} > out.log", "'>'"),
    ("python3 -c {program} >out.log", "'>out.log'"),
    ("python3 -c {program} >> out.log", "'>>'"),
    ("python3 -c {program} 2> err.log", "'2>'"),
    ("python3 -c {program} 2>&1", "'2>&1'"),
    ("python3 -c {program} &> all.log", "'&>'"),
    ("python3 -c {program} < in.txt", "'<'"),
    ("python3 -c {program} | tee out.log", "'|'"),
    ("python3 -c {program} && echo done", "'&&'"),
    ("python3 -c {program} || echo failed", "'||'"),
    ("python3 -c {program} ; echo done", "';'"),
    ("python3 -c {program} &", "'&'"),
    ("python3 -c {program} --data $HOME/data", "'$HOME/data' holds $HOME, an environment variable"),
    ("python3 -c {program} --data=${DATA}", "'--data=${DATA}' holds ${DATA}, an environment variable"),
    ("python3 -c {program} --user $(whoami)", "'$(whoami)' holds $(...), a command substitution"),
    ("python3 -c {program} --home ~", "'~' starts with ~"),
    ("python3 -c {program} --data ~/data", "'~/data' starts with ~"),
])
def test_a_shell_word_in_the_command_is_refused_and_bash_c_takes_the_line(tmp_path: Path, command: str,
                                                                          word: str) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(command_spec(tmp_path, command))
    assert f"trial.command: {word}" in str(refused.value)
    assert "the command is not run by a shell" in str(refused.value)
    assert "bash -c '...'" in str(refused.value)
    # the advice: the line as bash -c's script, one word the check leaves as it is, placeholders filled in it
    script = command.replace("-c {program}", "-c 'print(1)'").replace("'", "'\\''").replace("${DATA}", "${{DATA}}")
    spec = load_spec(command_spec(tmp_path, f"bash -c '{script}'"))
    inner = command.replace("-c {program}", "-c 'print(1)'").replace("{lr}", "0.1")
    assert spec.trial.command is not None
    assert command_argv(spec.trial.command, {"program": ARGV, "lr": 0.1}) == ("bash", "-c", inner)


def test_quoted_shell_words_are_text_and_the_rest_of_the_line_is_still_checked(tmp_path: Path) -> None:
    quoted = "python3 -c {program} --sep 'a > b' '>' \\> \"&&\" '$HOME' \\~ x~ 3$ --lr {lr}"
    spec = load_spec(command_spec(tmp_path, quoted))
    assert spec.trial.command == quoted
    with pytest.raises(SpecError, match=r"trial.command: '2>&1' is shell syntax \(a redirection\)"):
        load_spec(command_spec(tmp_path, quoted + " 2>&1"))


@pytest.mark.parametrize(("period", "seconds"), [("30s", 30.0), ("5m", 300.0), ("1.5h", 5400.0), ("90", 90.0),
                                                 ("1e2", 100.0)])
def test_policy_period_takes_a_duration_as_the_other_time_fields_do(tmp_path: Path, period: str,
                                                                    seconds: float) -> None:
    spec = load_spec(write_spec(tmp_path, policy={"name": "rr", "period": period},
                                search={"trials": 1, "max_time": period, "space": {"program": ARGV}}))
    assert spec.policy.period == spec.search.max_time == seconds
    assert spec.policy.settings == {"period": seconds}
    with pytest.raises(SpecError, match=r"policy.period: must be seconds or a duration like '90m'"):
        load_spec(write_spec(tmp_path, policy={"period": "soon"}))


def test_a_period_given_in_policy_period_and_in_params_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as refused:
        load_spec(write_spec(tmp_path, policy={"period": 3, "params": {"period": 5}}))
    assert str(refused.value).endswith("policy.params.period: 5, while policy.period is 3: both set the policy's "
                                       "period; give it once, as policy.period")
    assert load_spec(write_spec(tmp_path, policy={"params": {"period": 5}})).policy.settings == {"period": 5}
