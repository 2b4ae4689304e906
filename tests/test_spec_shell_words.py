"""Shell syntax in a spec, which no shell reads: a path's ``$HOME`` and a command's ``> out.log``, ``$HOME``, ``~`` or
``&&`` were taken as literal text without a word (a folder named ``$HOME`` beside the spec, arguments the program did
not expect); and the policy's period, which refused a duration the other time fields take and lost to
``params.period`` silently.

A command's shell words are refused in new input alone (a new experiment, a submission): an experiment stored before
the check came ran its command as written, and a rerun or a server started again continues it so (they were refused
as it was read back: a rerun could not continue it, and a server failed it)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.errors import SpecError
from hermes.experiment import load_spec, parse_spec
from hermes.experiment.command import command_argv
from hermes.experiment.spec import refuse_shell_words
from hermes.session import ExperimentSession
from hermes.store import ExperimentStatus, SqlStore

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
    ("python3 -c {program} --user $(whoami)", "'$(whoami)' holds $(...), a command substitution"),
    ("python3 -c {program} --home ~", "'~' starts with ~"),
    ("python3 -c {program} --data ~/data", "'~/data' starts with ~"),
])
def test_a_shell_word_in_the_command_is_refused_and_bash_c_takes_the_line(tmp_path: Path, command: str,
                                                                          word: str) -> None:
    with pytest.raises(SpecError) as refused:
        refuse_shell_words(load_spec(command_spec(tmp_path, command)), "spec.yaml")
    assert f"spec.yaml: trial.command: {word}" in str(refused.value)
    assert refused.value.problems[0][0] == "trial.command"
    assert "the command is not run by a shell" in str(refused.value)
    assert "bash -c '...'" in str(refused.value)
    # the advice: the line as bash -c's script, one word the check leaves as it is, placeholders filled in it
    script = command.replace("-c {program}", "-c 'print(1)'").replace("'", "'\\''")
    spec = load_spec(command_spec(tmp_path, f"bash -c '{script}'"))
    refuse_shell_words(spec, "spec.yaml")
    inner = command.replace("-c {program}", "-c 'print(1)'").replace("{lr}", "0.1")
    assert spec.trial.command is not None
    assert command_argv(spec.trial.command, {"program": ARGV, "lr": 0.1}) == ("bash", "-c", inner)


def test_quoted_shell_words_are_text_and_the_rest_of_the_line_is_still_checked(tmp_path: Path) -> None:
    quoted = "python3 -c {program} --sep 'a > b' '>' \\> \"&&\" \"~/x\" '$HOME' \\~ x~ 3$ \"a$\" --lr {lr}"
    spec = load_spec(command_spec(tmp_path, quoted))
    refuse_shell_words(spec, "spec.yaml")
    assert spec.trial.command == quoted
    with pytest.raises(SpecError, match=r"trial.command: '2>&1' is shell syntax \(a redirection\)"):
        refuse_shell_words(load_spec(command_spec(tmp_path, quoted + " 2>&1")), "spec.yaml")


def test_a_shell_variable_in_braces_is_told_apart_from_a_placeholder(tmp_path: Path) -> None:
    """``${DATA}`` is a placeholder of no parameter, refused as the spec is read, saying what a shell would make of
    it (it was refused as a shell's word, now checked after the placeholders)."""
    with pytest.raises(SpecError) as refused:
        load_spec(command_spec(tmp_path, "python3 -c {program} --data=${DATA}"))
    assert str(refused.value).endswith(
        "trial.command: placeholder {DATA} is not in search.space (parameters: lr, program), nor {trial_dir}, the "
        "trial's own folder; ${DATA} reads as a shell's variable, but no shell runs the command: run it through one "
        "(bash -c '...', docs/trials.md), the shell's braces doubled, ${{DATA}}")
    with pytest.raises(SpecError, match=r"'--lr=\$\{lr\}' holds \$\{lr\}, an environment variable \(a placeholder is "
                                         r"\{lr\}, without \$\)"):
        refuse_shell_words(load_spec(command_spec(tmp_path, "python3 -c {program} --lr=${lr}")), "spec.yaml")
    spec = load_spec(command_spec(tmp_path, "bash -c 'python3 -c {program} --data=${{DATA}}'"))
    refuse_shell_words(spec, "spec.yaml")
    assert command_argv(spec.trial.command or "", {"program": "x"}) == ("bash", "-c", "python3 -c x --data=${DATA}")


@pytest.mark.parametrize(("word", "found"), [
    ('"$HOME/data"', "$HOME, an environment variable, which a shell expands in double quotes too"),
    ('--lr="${lr}"', "${lr}, an environment variable (a placeholder is {lr}, without $), which a shell"),
    ('"$(whoami)"', "$(...), a command substitution, which a shell expands in double quotes too"),
    ("--user=`whoami`", "`...`, a command substitution, but"),
    ('"`date +%s`"', "`...`, a command substitution, which a shell expands in double quotes too"),
    ("'a'\"$USER\"", "$USER, an environment variable, which a shell"),
    ("$1", "$1, a shell parameter, but"),
    ('"$@"', "$@, a shell parameter, which a shell expands in double quotes too"),
    ("$*", "$*, a shell parameter"),
    ("--n=$#", "$#, a shell parameter"),
    ('"$?"', "$?, a shell parameter"),
])
def test_a_variable_in_double_quotes_or_a_shells_own_parameter_is_refused(tmp_path: Path, word: str,
                                                                          found: str) -> None:
    """A shell expands ``$NAME`` in double quotes too, and ``$1``, ``$@`` anywhere: ``"$HOME/data"`` was taken, and
    the program got ``$HOME/data``. Single quotes keep it text, as in a shell."""
    spec = load_spec(command_spec(tmp_path, f"python3 -c {{program}} {word} --lr {{lr}}"))
    with pytest.raises(SpecError) as refused:
        refuse_shell_words(spec, "spec.yaml")
    assert f"trial.command: {word!r} holds {found}" in str(refused.value)
    assert "or put the word in single quotes to pass it as it is" in str(refused.value)
    single = word.replace("'", "").replace('"', "")
    refuse_shell_words(load_spec(command_spec(tmp_path, f"python3 -c {{program}} '{single}'")), "spec.yaml")


@pytest.mark.parametrize("command", [
    'bash -c "python3 train.py --data $HOME/data --lr {lr} > $HERMES_TRIAL_DIR/out.log 2>&1"',
    '/bin/sh -c "echo $1 $@" _ {lr}',
    'bash -lc "cd ~/code && python3 train.py"',
    'zsh -o pipefail -ec "python3 train.py | tee out.log"',
])
def test_the_script_of_a_shells_c_is_left_to_that_shell_and_its_arguments_are_checked(tmp_path: Path,
                                                                                        command: str) -> None:
    """The shell that runs the script expands it, in double quotes too; the words after it are its arguments, which
    no shell expands."""
    refuse_shell_words(load_spec(command_spec(tmp_path, command)), "spec.yaml")
    with pytest.raises(SpecError, match=r"trial.command: '\"\$HOME\"' holds \$HOME"):
        refuse_shell_words(load_spec(command_spec(tmp_path, command + ' "$HOME"')), "spec.yaml")
    with pytest.raises(SpecError, match=r"trial.command: '\"\$HOME/x\"' holds \$HOME"):  # a script file's argument
        refuse_shell_words(load_spec(command_spec(tmp_path, 'bash run.sh "$HOME/x"')), "spec.yaml")


def _hermes_run(spec: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "hermes.cli", "run", str(spec), "--no-live", *args], cwd=spec.parent,
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def _tagged_spec(directory: Path, trials: int, command: str) -> Path:
    return write_spec(directory, trial={"command": command, "metrics_regex": r"acc (?P<value>\S+)"},
                      search={"trials": trials, "seed": 0,
                              "space": {"program": ARGV, "lr": {"type": "uniform", "low": 0, "high": 1}}})


def _store_as_before_the_check(directory: Path, name: str, command: str) -> int:
    """Store ``name`` as Hermes did before the check: its document as a spec of ``command`` dumps it, never run."""
    stored = load_spec(_tagged_spec(directory, 1, "python3 -c {program}")).model_dump(mode="json")
    stored["trial"]["command"] = command
    (directory / "runs").mkdir(exist_ok=True)
    with closing(SqlStore(f"sqlite:///{directory / 'runs' / 'hermes.db'}")) as store:
        return store.create_or_open_experiment(name, stored)


def test_an_experiment_stored_with_a_shell_word_before_the_check_continues_under_hermes_run(tmp_path: Path) -> None:
    """Stored before the check, its ``$TAG`` went to the program as it is; the rerun refused the word, and the word
    quoted, as the refusal advised, was a changed spec."""
    command = f"{sys.executable} -c {{program}} --tag $TAG --lr {{lr}}"
    experiment_id = _store_as_before_the_check(tmp_path, "shell", command)
    session = ExperimentSession(load_spec(_tagged_spec(tmp_path, 1, command)))  # as hermes.run does
    with closing(session.store):
        assert session.run().status is ExperimentStatus.FINISHED
    run = _hermes_run(_tagged_spec(tmp_path, 2, command))  # and once it ran, one more trial
    assert run.returncode == 0, run.stderr
    with closing(SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")) as store:
        assert [e.experiment_id for e in store.experiments()] == [experiment_id]
        assert [trial.state for trial in store.trials(experiment_id)] == ["completed", "completed"]
    for trial in ("0", "1"):  # as before the check: the word as it is
        assert "'--tag', '$TAG'" in (tmp_path / "runs" / "shell" / "trials" / trial / "stdout.log").read_text()


def test_a_new_experiments_shell_word_is_refused_by_hermes_run_before_anything_is_made(tmp_path: Path) -> None:
    spec = _tagged_spec(tmp_path, 1, f'{sys.executable} -c {{program}} --data "$HOME/data" --lr {{lr}}')
    run = _hermes_run(spec)
    assert run.returncode == 2, run.stderr
    assert "experiment shell: trial.command: '\"$HOME/data\"' holds $HOME, an environment variable, which a shell " \
           "expands in double quotes too" in run.stderr
    assert list(tmp_path.iterdir()) == [spec]  # no store, no folder
    # beside another experiment of its store; and as the corrected spec of one that never ran, which replaces it
    other = _store_as_before_the_check(tmp_path, "other", f"{sys.executable} -c {{program}} --lr {{lr}}")
    for name in ("shell", "other"):
        with pytest.raises(SpecError) as refused:
            ExperimentSession(load_spec(_tagged_spec(tmp_path, 1, f"{sys.executable} -c {{program}} $1"), name))
        assert str(refused.value).startswith(f"experiment {name}: trial.command: '$1' holds $1, a shell parameter")
    with closing(SqlStore(f"sqlite:///{tmp_path / 'runs' / 'hermes.db'}")) as store:
        [stored] = store.experiments()
        assert stored.experiment_id == other and "$1" not in stored.spec["trial"]["command"]


def test_a_stored_spec_is_read_back_whatever_its_command_holds(tmp_path: Path) -> None:
    """``parse_spec`` reads back stored specs too (a pool, a rerun): the check is no part of it."""
    document = yaml.safe_load(command_spec(tmp_path, "python3 -c {program} --tag $TAG > out.log").read_text())
    assert parse_spec(document).trial.command == "python3 -c {program} --tag $TAG > out.log"


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


def test_a_server_takes_up_an_experiment_stored_with_a_shell_word_and_refuses_a_new_one(tmp_path: Path) -> None:
    """A server started again failed such an experiment as it read its spec back, and left its runs open; a
    submission is new input, refused (a word in double quotes was taken, and reached the program unexpanded)."""
    pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
    from fastapi.testclient import TestClient
    from test_server import Server

    from hermes.experiment.spec import ResourcesSpec
    from hermes.server.app import ServerConfig, create_app

    def spec(name: str, command: str) -> dict[str, Any]:
        return {"name": name, "trial": {"command": command, "metrics_regex": r"acc (?P<value>\S+)"},
                "search": {"trials": 1, "space": {"program": ARGV}}, "metric": {"name": "acc", "mode": "max"},
                "budget": {"steps": 1}, "resources": {"gpus": "none", "cpu_slots": 1}}

    root = tmp_path / "server"
    with TestClient(create_app(ServerConfig(root=root, run_experiments=False))) as client:
        hermes = client.app.state.hermes  # type: ignore[attr-defined]
        token = hermes.accounts.add_user("alice")
        (root / "users" / "alice").mkdir(parents=True, exist_ok=True)
        headers = {"Authorization": f"Bearer {token}"}
        stored = hermes.stored(hermes.parse(spec("old", "python3 -c {program} --tag TAG"), "alice"))
        stored["trial"]["command"] = "python3 -c {program} --tag $TAG"  # as the server stored it before the check
        old = hermes.store.submit_experiment("old", stored, "alice")
        hermes.store.set_status(old, ExperimentStatus.INTERRUPTED)  # it ran under the old server, killed mid-run
        for command, word in [('python3 -c {program} --data "$HOME/data"', "'\"$HOME/data\"' holds $HOME"),
                              ("python3 -c {program} $1", "'$1' holds $1")]:
            response = client.post("/api/experiments", json={"spec": spec("new", command)}, headers=headers)
            assert response.status_code == 422, response.text
            [problem] = response.json()["detail"]
            assert problem["loc"] == ["body", "spec", "trial", "command"] and problem["msg"].startswith(word), problem
    config = ServerConfig(root=root, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, {"alice": token}
        ended = server.wait(old)
        assert (ended["status"], ended["error"]) == ("finished", None)
        assert [experiment["id"] for experiment in server.get("/api/experiments")] == [old]  # none refused was kept
    [log] = root.rglob("stdout.log")
    assert "'--tag', '$TAG'" in log.read_text()


def test_a_server_takes_up_an_experiment_stored_with_a_variable_in_its_path_or_a_second_period(tmp_path: Path) -> None:
    """The checks of a path's variable and of a period given twice came after such specs were stored: a server started
    again failed their experiments as it read them back (the pool's take-up, and the end of their old runs)."""
    pytest.importorskip("fastapi", reason="the server needs the server extra: pip install -e '.[server]'")
    from fastapi.testclient import TestClient
    from test_server import Server

    from hermes.experiment.spec import ResourcesSpec
    from hermes.server.app import ServerConfig, create_app

    spec = {"name": "old", "trial": {"command": "python3 -c {program}", "metrics_regex": r"acc (?P<value>\S+)"},
            "search": {"trials": 1, "space": {"program": ARGV}}, "metric": {"name": "acc", "mode": "max"},
            "budget": {"steps": 1}, "resources": {"gpus": "none", "cpu_slots": 1}, "storage": {"dir": "runs"},
            "policy": {"name": "rr"}}
    root = tmp_path / "server"
    with TestClient(create_app(ServerConfig(root=root, run_experiments=False))) as client:
        hermes = client.app.state.hermes  # type: ignore[attr-defined]
        token = hermes.accounts.add_user("alice")
        (root / "users" / "alice").mkdir(parents=True, exist_ok=True)
        stored = hermes.stored(hermes.parse(spec, "alice"))
        stored["storage"]["dir"] = stored["storage"]["dir"].replace("/runs", "/$RUNS")  # as stored before the checks
        stored["policy"].update(period=5.0, params={"period": 0.5})
        old = hermes.store.submit_experiment("old", stored, "alice")
        hermes.store.set_status(old, ExperimentStatus.INTERRUPTED)  # it ran under the old server, killed mid-run
        raw = hermes.store.submit_experiment("raw", {**stored, "name": "raw"}, "alice")  # written straight, never run
    config = ServerConfig(root=root, resources=ResourcesSpec(gpus="none", cpu_slots=1), poll=0.1)
    with TestClient(create_app(config)) as client:
        server = Server.__new__(Server)
        server.client, server.tokens = client, {"alice": token}
        ended = server.wait(old)
        assert (ended["status"], ended["error"]) == ("finished", None)
        refused = server.wait(raw)  # new input, whatever route wrote it to the store
        assert refused["status"] == "failed" and "$RUNS, an environment variable" in refused["error"], refused
    assert (root / "users" / "alice" / "$RUNS" / "old").is_dir()  # where it ran before
    with pytest.raises(SpecError, match=r"\$RUNS, an environment variable"):  # new input is still refused
        parse_spec({**stored, "name": "new"})


def test_a_submission_through_the_pool_api_is_new_input(tmp_path: Path) -> None:
    """``PoolSession.submit`` (docs/pool.md) queued a command with ``> out.log`` for the pool, which read it back as
    a stored spec: its words reached the program as arguments."""
    from hermes.pool import PoolSession

    spec = load_spec(command_spec(tmp_path, "python3 -c {program} > out.log"))
    with closing(SqlStore(f"sqlite:///{tmp_path / 'pool.db'}")) as store:
        with pytest.raises(SpecError, match="not run by a shell"):
            PoolSession.submit(store, spec, owner="alice")
        assert store.experiments() == []
