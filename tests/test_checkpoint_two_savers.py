"""A damaged checkpoint of a trial with two savers (``trial.Files`` beside ``trial.Checkpoint``, as docs/trials.md
suggests for generators of one's own) is moved aside and the trial retrains from scratch, whichever saver restores
first, and nothing the other restored is left in the fresh run.

Real runners (``hermes run``) and trials: the trial damages its own newest checkpoint after step 3 and crashes, so its
next run resumes from that checkpoint. And what a resume says where the first checkpoint's write was cut short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hermes.core.states import TrialState
from hermes.report import open_store, pick_experiment
from hermes.trial import protocol
from test_run import environment, load_view, run_ok, write_spec

BUDGET = 5

TRIAL = """
import json, shutil, sys
from hermes import trial


def train(config):
    st = {"w": 0}
    def restore_files():
        files = trial.Files(lambda d: (d / "w.json").write_text(json.dumps(st)),
                            lambda d: st.update(json.loads((d / "w.json").read_text())))
        return files.restore()
    if config["order"] == "files first":
        state = trial.Checkpoint(rng=True)
        start, other = restore_files(), state.restore()
    elif config["order"] == "state first":
        state = trial.Checkpoint(rng=True)
        start, other = state.restore(), restore_files()
    else:  # "late saver": the Checkpoint is created once the files are restored
        start = restore_files()
        other = trial.Checkpoint(rng=True).restore()
    with open(trial.trial_dir() / "runs.log", "a") as log:
        log.write(f"{start} {other} {st['w']}\\n")
    for step in range(start, trial.budget()):
        st["w"] += 1
        trial.report(step + 1, loss=1 / (1 + st["w"]), w=st["w"])
        marker = trial.trial_dir() / "damaged"
        if step + 1 == 3 and not marker.exists():
            marker.touch()
            part = trial.checkpoint_dir() / ("files" if config["damage"] == "files gone" else "state")
            if config["damage"] == "files gone":
                shutil.rmtree(part)
            for saved in part.glob("state.p*"):
                saved.write_bytes(b"")
            raise RuntimeError("the runner dies with its checkpoint damaged")


if __name__ == "__main__":
    train(trial.config())
"""


def spec(folder: Path, name: str, config: dict[str, Any], mode: str) -> dict[str, Any]:
    (folder / "twosavers.py").write_text(textwrap.dedent(TRIAL))
    how: dict[str, Any] = {"command": "python twosavers.py"} if mode == "command" else {
        "function": "twosavers:train", "warm_workers": mode == "warm worker"}
    return {
        "name": name,
        "trial": {**how, "workdir": str(folder)},
        "search": {"configs": [config]},
        "metric": {"name": "loss", "mode": "min"},
        "budget": {"steps": BUDGET},
        "policy": {"name": "fifo"},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": str(folder / "runs"), "checkpoint_every": 1},
    }


@pytest.mark.parametrize(("order", "damage", "mode"), [
    ("files first", "state emptied", "warm worker"),
    ("files first", "state emptied", "process per run"),
    ("files first", "state emptied", "command"),
    ("state first", "files gone", "warm worker"),
])
def test_a_damaged_part_is_moved_aside_and_the_trial_retrains_whichever_saver_restores_first(
    tmp_path: Path, order: str, damage: str, mode: str,
) -> None:
    """With Files restored first, the damaged Checkpoint part failed the trial ("another part of it is restored
    already: delete checkpoints/"), after running it again max_failures times against the same file."""
    run_ok(write_spec(tmp_path, spec(tmp_path, "two-savers", {"order": order, "damage": damage}, mode)))
    view, _ = load_view(tmp_path / "runs")
    [ended] = view.trials
    assert ended.state is TrialState.COMPLETED, ended.error
    directory = tmp_path / "runs" / "two-savers" / "trials" / ended.trial_id
    # both runs start fresh: the second restores nothing, neither the damaged part nor the sound one
    assert (directory / "runs.log").read_text().splitlines() == ["0 0 0", "0 0 0"]
    stderr = (directory / "stderr.log").read_text()
    assert "is damaged (" in stderr and f"moved to {directory / 'checkpoints.damaged'}" in stderr, stderr
    assert (directory / "checkpoints.damaged" / "step-3").is_dir()
    store = open_store(tmp_path / "runs")
    try:
        metrics = store.metrics(pick_experiment(store, None).experiment_id)
    finally:
        store.close()
    assert [(m.step, m.values["w"]) for m in metrics] == [(step, step) for step in range(1, BUDGET + 1)]


def test_a_part_damaged_where_a_saver_created_after_another_restored_ends_the_run_and_the_next_retrains(
    tmp_path: Path,
) -> None:
    """A saver created after another's restore cannot be checked before that one loads: its run ends, as a crash,
    with the checkpoint moved aside, so the next run retrains from scratch; it met the same file until it failed."""
    run_ok(write_spec(tmp_path, spec(tmp_path, "late-saver", {"order": "late saver", "damage": "state emptied"},
                                     "warm worker")))
    view, _ = load_view(tmp_path / "runs")
    [ended] = view.trials
    assert ended.state is TrialState.COMPLETED, ended.error
    directory = tmp_path / "runs" / "late-saver" / "trials" / ended.trial_id
    # the run that met the damage ended in its restore, with the files of step 3 loaded; the next one starts fresh
    assert (directory / "runs.log").read_text().splitlines() == ["0 0 0", "0 0 0"]
    stderr = (directory / "stderr.log").read_text()
    assert "another part of it, restored already, is in the trial: its checkpoints were moved to " in stderr, stderr
    assert (directory / "checkpoints.damaged" / "step-3").is_dir()


def test_a_resume_after_its_first_checkpoint_write_was_cut_short_says_none_was_committed(tmp_path: Path) -> None:
    """A runner killed while a parked trial spilled its first checkpoint (only ``checkpoints/.tmp-step-1`` there) ran
    it again saying "its checkpoint is gone", as if someone had deleted a checkpoint that was committed. The trial's
    process, with the environment and channel its executor gives it, resuming at step 1."""
    directory = tmp_path / "t1"
    (directory / "checkpoints" / ".tmp-step-1" / "files").mkdir(parents=True)  # what the kill left
    (directory / "config.json").write_text("{}")
    answers, messages = os.pipe(), os.pipe()
    environment_of_trial = {
        **environment(), protocol.ENV_TRIAL_ID: "t1", protocol.ENV_TRIAL_DIR: str(directory),
        protocol.ENV_BUDGET: "5", protocol.ENV_REPORTED_STEP: "1", protocol.ENV_CHECKPOINT_EVERY: "2",
        protocol.ENV_CHANNEL: f"{answers[0]},{messages[1]}",
    }
    ran = subprocess.run([sys.executable, "-c", "from hermes import trial; print(trial.start_step())"],
                         env=environment_of_trial, pass_fds=(answers[0], messages[1]), capture_output=True, text=True,
                         timeout=60)
    for fd in (*answers, *messages):
        os.close(fd)
    assert ran.returncode == 0 and ran.stdout == "0\n", ran.stderr
    assert ran.stderr == (
        "hermes: trial t1: it resumes at step 1, but none of its checkpoints was committed: the write of its first was "
        f"cut short (a crash, a kill) (there is no {directory / 'checkpoints' / 'latest'}); it retrains from scratch "
        "(its steps up to 1 are trained again, not recorded again)\n")


EXPORT_TRIAL = """
from pathlib import Path
import torch
from hermes import trial


def rss_mb():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def train(config):
    model = torch.nn.Linear(4, 1)
    export = torch.nn.Linear(3000, 3000)  # 36 MB, saved for an export, never restored
    state = trial.Checkpoint(model=model)
    trial.Checkpoint(name="export", model=export)
    before = rss_mb()
    start = state.restore()
    for step in range(start, trial.budget()):
        trial.report(step + 1, loss=1 / (step + 1))
        if start:
            (trial.trial_dir() / "grown.txt").write_text(f"{rss_mb() - before:.1f}")
            return
        crashed = trial.trial_dir() / "crashed"
        if step + 1 == 2 and not crashed.exists():
            crashed.touch()
            raise RuntimeError("crash once: the next run resumes from step 2")
"""


def test_a_part_checked_but_never_restored_is_not_held_once_the_trial_reports(tmp_path: Path) -> None:
    """The first restore reads every ``Checkpoint`` part to check it, and kept a part that no ``restore`` ever took (an
    export saved beside the state) in the trial's memory to its end: 36 MB here."""
    pytest.importorskip("torch")
    (tmp_path / "export.py").write_text(textwrap.dedent(EXPORT_TRIAL))
    run_ok(write_spec(tmp_path, {**spec(tmp_path, "export", {"order": "-", "damage": "-"}, "warm worker"),
                                 "trial": {"function": "export:train", "workdir": str(tmp_path)}}))
    [grown] = (tmp_path / "runs" / "export" / "trials").glob("*/grown.txt")
    assert float(grown.read_text()) < 18, f"{grown.read_text()} MB more after the first report than before restore"
