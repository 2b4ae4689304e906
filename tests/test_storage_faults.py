"""Storage that fails a trial's files, not the trial: a file-size limit, a read-only trials folder, a damaged or
foreign checkpoint, a store deleted before an interrupt. None of them may fail a trial for good."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hermes import trial
from hermes.errors import HermesError
from hermes.report import open_store, pick_experiment
from hermes.trial import protocol
from test_run import RUN_TIMEOUT, TESTS, environment, hermes_command, search, spec_of, write_spec
from test_trial_api import Channel


def outcome_of(runs: Path) -> tuple[str, list[str]]:
    """The experiment's status and its trials' states, as the store holds them."""
    store = open_store(runs)
    try:
        experiment = pick_experiment(store, None)
        return experiment.status.value, [t.state.value for t in store.trials(experiment.experiment_id)]
    finally:
        store.close()


def limit_file_size(size: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


@pytest.mark.parametrize("warm", [True, False])
def test_a_file_size_limit_hit_by_a_checkpoint_interrupts_the_run_and_a_rerun_without_it_completes_it(
        tmp_path: Path, warm: bool) -> None:
    """torch.save past ulimit -f says a RuntimeError ("unexpected pos"): that failed the trials for good."""
    spec = spec_of("fsize", search=search(2, 0, 0.01, ballast_kb={"type": "choice", "values": [512]},
                                          ballast_error={"type": "choice", "values": ["runtime"]}),
                   budget={"steps": 3}, storage={"dir": "runs", "checkpoint_every": 1},
                   trial={"function": "trials.curve:train", "workdir": str(TESTS), "warm_workers": warm})
    path = write_spec(tmp_path, spec)
    command = [*hermes_command("run", str(path), "--no-live")]
    limited = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True,
                             timeout=RUN_TIMEOUT, preexec_fn=lambda: limit_file_size(256 * 1024))
    assert limited.returncode == 2, limited.stderr
    assert "file-size limit of 262144 bytes" in limited.stderr and "ballast" in limited.stderr, limited.stderr
    # said as what it is, with its fix: it was said "no space left ... free some space"
    assert limited.stderr.startswith("hermes: error: a file reached the file-size limit: trial "), limited.stderr
    assert (f"interrupted: raise the file-size limit (`ulimit -f unlimited`), then run `hermes run {path}` again to "
            "continue") in limited.stderr and "no space left" not in limited.stderr, limited.stderr
    assert outcome_of(tmp_path / "runs")[0] == "interrupted"
    rerun = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr
    assert outcome_of(tmp_path / "runs") == ("finished", ["completed"] * 2)


READ_ONLY_TRIALS = """
import json, subprocess, time
from pathlib import Path
trials = Path({trials!r})
runner = subprocess.Popen({command!r}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
deadline = time.monotonic() + 60
while not any(trials.glob("*/checkpoints/latest")) and time.monotonic() < deadline:
    time.sleep(0.05)
subprocess.run(["mount", "--bind", str(trials), str(trials)], check=True)
for attempt in range(100):  # busy while a file in it is open for writing, now and then
    if subprocess.run(["mount", "-o", "remount,bind,ro", str(trials)], capture_output=True).returncode == 0:
        break
    time.sleep(0.02)
else:
    raise SystemExit("the trials folder stayed busy: it could not be made read-only")
out, err = runner.communicate(timeout=90)
subprocess.run(["umount", str(trials)], check=True)
print(json.dumps({{"code": runner.returncode, "stderr": err}}))
"""


def test_a_read_only_trials_folder_interrupts_the_run_and_a_rerun_once_writable_completes_it(tmp_path: Path) -> None:
    """A trials folder made read-only mid-run failed every trial ("cannot make its folder: Read-only file system")."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("needs unshare -rm to mount the trials folder read-only")
    spec = spec_of("erofs", search=search(4, 0, 0.2), budget={"steps": 6},
                   storage={"dir": "runs", "checkpoint_every": 1})
    path = write_spec(tmp_path, spec)
    command = [*hermes_command("run", str(path), "--no-live")]
    trials = tmp_path / "runs" / "erofs" / "trials"
    trials.mkdir(parents=True)
    (tmp_path / "scenario.py").write_text(READ_ONLY_TRIALS.format(trials=str(trials), command=command))
    result = subprocess.run(["unshare", "-rm", sys.executable, str(tmp_path / "scenario.py")], cwd=tmp_path,
                            env=environment(), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    limited = json.loads(result.stdout.splitlines()[-1])
    assert limited["code"] == 2 and "Read-only file system" in limited["stderr"], limited["stderr"]
    # met by a trial, or by the runner making a trial's folder: it was said "no space left ... free some space"
    assert limited["stderr"].startswith("hermes: error: read-only file system: "), limited["stderr"]
    assert "interrupted: make it writable again (remount it read-write), then run" in limited["stderr"]
    assert outcome_of(tmp_path / "runs")[0] == "interrupted"
    rerun = subprocess.run(command, cwd=tmp_path, env=environment(), capture_output=True, text=True,
                           timeout=RUN_TIMEOUT)
    assert rerun.returncode == 0, rerun.stderr
    assert outcome_of(tmp_path / "runs") == ("finished", ["completed"] * 4)


def suspended_with_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trial with a torch Checkpoint suspended at step 2; the folder of its committed checkpoint."""
    Channel(tmp_path / "t1", monkeypatch).answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.Checkpoint(model=torch.nn.Linear(3, 2))
    trial.report(1, accuracy=0.5)
    with pytest.raises(trial.SuspendExit):
        trial.report(2, accuracy=0.6)
    return tmp_path / "t1" / protocol.CHECKPOINTS_DIR / "step-2"


def resumed_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **objects: object) -> int:
    """What a resumed run of the trial restores."""
    Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_REPORTED_STEP: "2"})
    return trial.Checkpoint(**objects or {"model": torch.nn.Linear(3, 2)}).restore()


def test_a_checkpoint_whose_part_folder_is_gone_is_set_aside_and_the_trial_retrains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Its saver's folder deleted (latest and hermes.json intact) failed the trial for good, taken for a saver created
    after the first report."""
    checkpoint = suspended_with_a_checkpoint(tmp_path, monkeypatch)
    shutil.rmtree(checkpoint / "state")
    capsys.readouterr()
    assert resumed_step(tmp_path, monkeypatch) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"hermes: trial t1: its checkpoint {checkpoint / 'state'} is damaged (it is missing)"), err
    assert (tmp_path / "t1" / "checkpoints.damaged" / "step-2").is_dir()


def test_a_saver_created_after_the_checkpoint_is_still_told_to_come_before_the_first_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suspended_with_a_checkpoint(tmp_path, monkeypatch)
    Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_REPORTED_STEP: "2"})
    trial.Checkpoint(model=torch.nn.Linear(3, 2)).restore()
    with pytest.raises(HermesError, match="no part 'files': create every saver before the first report"):
        trial.Files(lambda directory: None, lambda directory: None).restore()


def test_a_state_file_that_trial_checkpoint_did_not_write_is_set_aside_and_the_trial_retrains(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A readable torch file of another structure failed the trial for good: "uncaught KeyError: 'objects'"."""
    state = suspended_with_a_checkpoint(tmp_path, monkeypatch) / "state" / "state.pt"
    torch.save({"model": 1}, state)
    capsys.readouterr()
    assert resumed_step(tmp_path, monkeypatch) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"hermes: trial t1: its checkpoint {state} is damaged (not a state that trial.Checkpoint "
                          "wrote)"), err


def test_a_checkpoint_without_an_object_the_trial_restores_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    suspended_with_a_checkpoint(tmp_path, monkeypatch)
    with pytest.raises(HermesError, match="holds no 'net' \\(it holds 'model'\\)"):
        resumed_step(tmp_path, monkeypatch, net=torch.nn.Linear(3, 2))


def test_a_run_interrupted_after_its_store_was_deleted_says_its_record_is_lost(tmp_path: Path) -> None:
    """It said "interrupted: run ... again to continue", and the rerun silently started over."""
    spec = spec_of("deleted", search=search(2, 0, 0.3), budget={"steps": 20})
    path = write_spec(tmp_path, spec)
    runner = subprocess.Popen([*hermes_command("run", str(path), "--no-live")], cwd=tmp_path, env=environment(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any((tmp_path / "runs" / "deleted" / "trials").glob("*/checkpoints/latest")):
        assert time.monotonic() < deadline and runner.poll() is None
        time.sleep(0.05)
    (tmp_path / "runs" / "hermes.db").unlink()
    runner.send_signal(signal.SIGTERM)
    _, err = runner.communicate(timeout=RUN_TIMEOUT)
    assert "hermes.db was deleted or replaced while the experiment ran" in err, err
    assert "again to continue" not in err, err
