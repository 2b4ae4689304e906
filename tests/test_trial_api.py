"""The trial API against real pipes and real checkpoint files; the test plays the executor."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hermes
import hermes.trial.session as session_module
from hermes import trial
from hermes.errors import HermesError
from hermes.trial import load_state, protocol
from tests.test_run import search, spec_of


class Channel:
    """The executor's ends of a trial's pipes, and the trial's session installed in this process."""

    def __init__(self, directory: Path, monkeypatch: pytest.MonkeyPatch, **environment: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / protocol.CONFIG_FILE).write_text(json.dumps({"lr": 0.1}))
        answers_read, self.answers = os.pipe()
        self.messages, messages_write = os.pipe()
        os.set_blocking(self.messages, False)
        env = {
            protocol.ENV_TRIAL_ID: "t1",
            protocol.ENV_TRIAL_DIR: str(directory),
            protocol.ENV_CHANNEL: f"{answers_read},{messages_write}",
            protocol.ENV_BUDGET: "10",
            protocol.ENV_METRIC: "accuracy",
            **environment,
        }
        self.session = session_module.Session.from_environment(env)
        monkeypatch.setattr(session_module, "_current", self.session)

    def answer(self, *words: str) -> None:
        os.write(self.answers, "".join(f"{word}\n" for word in words).encode())

    def received(self) -> list[dict]:
        try:
            data = os.read(self.messages, 1 << 16)
        except BlockingIOError:
            return []
        return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def channel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Channel:
    return Channel(tmp_path / "t1", monkeypatch)


def test_identity_config_and_fresh_start(channel: Channel, tmp_path: Path) -> None:
    assert trial.trial_id() == "t1"
    assert trial.config() == {"lr": 0.1}
    assert trial.budget() == 10
    assert trial.start_step() == 0
    assert trial.trial_dir() == tmp_path / "t1"
    assert trial.checkpoint_dir() is None


def test_report_blocks_for_the_answer_and_goes_on(channel: Channel) -> None:
    channel.answer(protocol.CONTINUE, protocol.CONTINUE)
    trial.report(1, accuracy=0.5, loss=2.0)
    trial.report(2, accuracy=torch.tensor(0.75))  # anything float() accepts
    assert channel.received() == [
        {"type": "report", "step": 1, "metrics": {"accuracy": 0.5, "loss": 2.0}, "checkpointed": False},
        {"type": "report", "step": 2, "metrics": {"accuracy": 0.75}, "checkpointed": False},
    ]


def test_suspend_commits_a_checkpoint_then_exits_cleanly(channel: Channel) -> None:
    model = torch.nn.Linear(3, 2)
    trial.Checkpoint(model=model)
    channel.answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.report(1, accuracy=0.5)
    with pytest.raises(trial.SuspendExit) as exit_info:
        trial.report(2, accuracy=0.6)
    assert isinstance(exit_info.value, SystemExit) and exit_info.value.code == 0
    assert channel.received()[-1] == {"type": "suspended", "step": 2}
    directory, step = protocol.latest_checkpoint(channel.session.directory)
    assert step == 2 and directory.name == "step-2"
    saved = torch.load(directory / "state" / "state.pt", weights_only=False)
    assert torch.equal(saved["objects"]["model"]["weight"], model.weight)


def test_stop_exits_without_checkpoint(channel: Channel) -> None:
    channel.answer(protocol.STOP)
    with pytest.raises(trial.StopExit):
        trial.report(1, accuracy=0.5)
    assert trial.checkpoint_dir() is None


def test_a_closed_channel_ends_the_trial_with_an_error(channel: Channel) -> None:
    os.close(channel.answers)
    with pytest.raises(HermesError, match="closed the channel"):
        trial.report(1, accuracy=0.5)


def test_reports_are_validated_in_the_trial(channel: Channel) -> None:
    channel.answer(protocol.CONTINUE, protocol.CONTINUE, protocol.CONTINUE)
    with pytest.raises(ValueError, match="steps count from 1"):
        trial.report(0, accuracy=0.5)  # a loop from 0 that reports its epoch
    with pytest.raises(ValueError, match="at most 2147483647"):
        trial.report(2**31, accuracy=0.5)  # no store could keep it
    trial.report(3, accuracy=0.5)
    with pytest.raises(ValueError, match="must exceed the previous step 3"):
        trial.report(3, accuracy=0.5)
    with pytest.raises(ValueError, match="objective metric 'accuracy' .*; it reported 'acc', 'loss'"):
        trial.report(4, acc=0.5, loss=1.0)  # what a misspelt metric name gives
    for wrong, shown in ((None, "NoneType None"), ("high", "str 'high'"), (torch.ones(2), "Tensor tensor")):
        with pytest.raises(TypeError, match=f"metric 'accuracy' must be a number, got {shown}"):
            trial.report(4, accuracy=wrong)
    for wrong in (4.0, True, "4"):
        with pytest.raises(TypeError, match="step must be an int"):
            trial.report(wrong, accuracy=0.5)  # type: ignore[arg-type]
    trial.report(np.int64(4), accuracy=np.float32(0.6))  # numpy's and torch's numbers are numbers
    trial.report(torch.tensor(5), accuracy=torch.tensor(0.7))
    sent = [(message["step"], message["metrics"]) for message in channel.received()]
    assert sent == [(3, {"accuracy": 0.5}), (4, {"accuracy": pytest.approx(0.6)}), (5, {"accuracy": pytest.approx(0.7)})]


def test_a_metric_besides_the_objective_that_is_no_number_is_left_out_saying_so_once(
    channel: Channel, capsys: pytest.CaptureFixture[str],
) -> None:
    """Ray Tune keeps any value; the store keeps numbers: the trial failed before its first report, where a
    program's line read with trial.metrics_regex leaves such a group out."""
    channel.answer(protocol.CONTINUE, protocol.CONTINUE)
    trial.report(1, accuracy=0.5, phase="warm-up", checkpoint=None)
    trial.report(2, accuracy=0.6, phase="train")
    assert [message["metrics"] for message in channel.received()] == [{"accuracy": 0.5}, {"accuracy": 0.6}]
    assert capsys.readouterr().err.splitlines() == [
        "hermes: trial t1: its metric 'phase' is left out: the store keeps numbers, it reported str 'warm-up'",
        "hermes: trial t1: its metric 'checkpoint' is left out: the store keeps numbers, it reported NoneType None",
    ]


def test_a_resumed_trial_without_a_checkpoint_of_its_state_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Suspended (spilled) with no saver, it has nothing to resume from: it trains again from step 1, which
    is what a loop that ignores the checkpoint does, and the steps the scheduler knows are reported again."""
    first = Channel(tmp_path / "t1", monkeypatch)
    first.answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.report(1, accuracy=0.5)
    with pytest.raises(trial.SuspendExit):
        trial.report(2, accuracy=0.6)  # the checkpoint holds the step only

    resumed = Channel(tmp_path / "t1", monkeypatch)
    assert trial.start_step() == 2
    resumed.answer(*[protocol.CONTINUE] * 3)
    for step, accuracy in ((1, 0.5), (2, 0.6), (3, 0.7)):
        trial.report(step, accuracy=accuracy)
    assert [message["step"] for message in resumed.received()] == [1, 2, 3]  # the executor skips 1 and 2
    assert trial.start_step() == 0
    assert "keeps no checkpoint of its state" in capsys.readouterr().err
    with pytest.raises(ValueError, match="must exceed the previous step 3"):
        trial.report(1, accuracy=0.5)  # once going, a step that goes back is a bug in the loop


def test_a_resumed_trial_that_registered_a_checkpoint_but_starts_over_is_told_to_restore_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(3, 2)
    first = Channel(tmp_path / "t1", monkeypatch)
    trial.Checkpoint(model=model)
    first.answer(protocol.SUSPEND)
    with pytest.raises(trial.SuspendExit):
        trial.report(1, accuracy=0.5)

    resumed = Channel(tmp_path / "t1", monkeypatch)
    state = trial.Checkpoint(model=model)  # registered, not restored
    with pytest.raises(session_module.ResumeError) as raised:
        trial.report(1, accuracy=0.5)
    message = str(raised.value)
    assert message.startswith("trial t1 reported step 1, but it resumed from its checkpoint of step 1: ")
    assert "range(state.restore(), trial.budget())" in message
    assert isinstance(raised.value, HermesError) and resumed.received() == []
    resumed.answer(protocol.CONTINUE)
    assert state.restore() == 1
    trial.report(2, accuracy=0.6)  # restoring, then continuing from the checkpoint's step is what it should do
    assert resumed.received() == [{"type": "report", "step": 2, "metrics": {"accuracy": 0.6}, "checkpointed": False}]


def test_a_report_may_leave_its_step_out_and_give_its_metrics_as_a_dict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Tune's ``report(metrics)``: the step is the next one, counted from a restored checkpoint's step, or
    from 1 for a trial with nothing to restore unless it asked where to start."""
    first = Channel(tmp_path / "t1", monkeypatch)
    trial.Checkpoint(model=torch.nn.Linear(3, 2))
    first.answer(protocol.CONTINUE, protocol.CONTINUE, protocol.SUSPEND)
    trial.report(accuracy=0.5)
    trial.report({"accuracy": 0.6, "loss": 1.0}, loss=0.9)  # keywords win over the dict
    with pytest.raises(trial.SuspendExit):
        trial.report(accuracy=0.7)
    assert [(m["step"], m["metrics"]) for m in first.received()[:3]] == [
        (1, {"accuracy": 0.5}), (2, {"accuracy": 0.6, "loss": 0.9}), (3, {"accuracy": 0.7})]

    resumed = Channel(tmp_path / "t1", monkeypatch)
    assert trial.Checkpoint(model=torch.nn.Linear(3, 2)).restore() == 3
    assert step_of_a_report(resumed) == 4

    shutil.rmtree(tmp_path / "t1")  # a trial with no saver, resumed from a checkpoint of step 2
    first = Channel(tmp_path / "t1", monkeypatch)
    first.answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.report(accuracy=0.5)
    with pytest.raises(trial.SuspendExit):
        trial.report(accuracy=0.6)
    assert step_of_a_report(Channel(tmp_path / "t1", monkeypatch)) == 1  # its loop began again
    resumed = Channel(tmp_path / "t1", monkeypatch)
    assert trial.start_step() == 2
    assert step_of_a_report(resumed) == 3  # it asked where to go on from


def step_of_a_report(channel: Channel) -> int:
    """Report once without a step, answered continue; the step the report was of."""
    channel.answer(protocol.CONTINUE)
    trial.report(accuracy=0.8)
    return channel.received()[-1]["step"]


def test_several_metrics_need_a_named_objective(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_METRIC: ""})
    with pytest.raises(ValueError, match="names no objective"):
        trial.report(1, accuracy=0.5, loss=1.0)


def test_periodic_checkpoints_are_reported_as_checkpointed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    channel = Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_CHECKPOINT_EVERY: "2"})
    channel.answer(*[protocol.CONTINUE] * 3)
    for step in (1, 2, 3):
        trial.report(step, accuracy=0.1 * step)
    assert [message["checkpointed"] for message in channel.received()] == [False, True, False]
    assert protocol.latest_checkpoint(channel.session.directory)[1] == 2


def test_restore_resumes_model_optimizer_and_every_random_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    first = Channel(tmp_path / "t1", monkeypatch)
    trial.Checkpoint(model=model, optimizer=optimizer)
    first.session.save(5)
    expected = (random.random(), np.random.rand(), torch.rand(3))

    # A new process of the same trial: fresh objects, then restore.
    Channel(tmp_path / "t1", monkeypatch)
    assert trial.start_step() == 5
    torch.manual_seed(1)
    restored_model = torch.nn.Linear(4, 2)
    restored_optimizer = torch.optim.SGD(restored_model.parameters(), lr=0.1, momentum=0.9)
    assert trial.Checkpoint(model=restored_model, optimizer=restored_optimizer).restore() == 5
    assert torch.equal(restored_model.weight, model.weight)
    assert torch.equal(
        restored_optimizer.state_dict()["state"][0]["momentum_buffer"],
        optimizer.state_dict()["state"][0]["momentum_buffer"],
    )
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


def test_files_saver_and_checkpoint_dir(channel: Channel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notes = {"seen": 3}
    trial.Files(lambda d: (d / "notes.json").write_text(json.dumps(notes)), lambda d: None, name="notes")
    channel.session.save(1)
    assert json.loads((trial.checkpoint_dir() / "notes" / "notes.json").read_text()) == notes

    Channel(tmp_path / "t1", monkeypatch)
    loaded: dict = {}
    files = trial.Files(
        lambda d: None, lambda d: loaded.update(json.loads((d / "notes.json").read_text())), name="notes"
    )
    assert files.restore() == 1 and loaded == notes


def test_a_crash_while_saving_leaves_the_previous_checkpoint(channel: Channel) -> None:
    state = {"value": 1}
    crash = False

    def save(directory: Path) -> None:
        (directory / "half.txt").write_text(str(state["value"]))
        if crash:
            raise OSError("disk full")

    trial.Files(save, lambda d: None)
    channel.session.save(1)
    state["value"], crash = 2, True
    with pytest.raises(OSError):
        channel.session.save(2)
    directory, step = protocol.latest_checkpoint(channel.session.directory)
    assert step == 1 and (directory / "files" / "half.txt").read_text() == "1"
    crash = False
    channel.session.save(3)  # cleans up what the crash left
    assert sorted(p.name for p in (channel.session.directory / "checkpoints").iterdir()) == ["latest", "step-3"]


def test_a_checkpoint_reaches_the_disk_before_it_is_published(channel: Channel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Power-loss safety: the saver's files, the checkpoint directory and the pointer are flushed
    (fsync) before the pointer names them, and the pointer's new name is flushed after."""
    journal: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (journal.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (journal.append(("publish", str(b))), real_replace(a, b)))
    trial.Files(lambda d: (d / "weights.bin").write_bytes(b"w" * 1000), lambda d: None, name="model")
    channel.session.save(4)
    root = channel.session.directory / "checkpoints"
    published = journal.index(("publish", str(root / "latest")))
    synced_before = {Path(path).name for kind, path in journal[:published] if kind == "fsync"}
    assert {"weights.bin", protocol.META_FILE, "model", ".tmp-step-4", "latest.tmp", "checkpoints"} <= synced_before
    assert ("fsync", str(root)) in journal[published + 1:]


def test_restore_refuses_a_checkpoint_without_its_part(channel: Channel) -> None:
    channel.session.save(1)
    with pytest.raises(HermesError, match="no part 'files'"):
        trial.Files(lambda d: None, lambda d: None).restore()


def test_saver_names_are_unique(channel: Channel) -> None:
    trial.Files(lambda d: None, lambda d: None)
    with pytest.raises(HermesError, match="already registered"):
        trial.Files(lambda d: None, lambda d: None)
    with pytest.raises(HermesError, match="invalid"):
        trial.Files(lambda d: None, lambda d: None, name="../x")


def test_outside_an_executor_the_api_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "_current", None)
    monkeypatch.delenv(protocol.ENV_CHANNEL, raising=False)
    with pytest.raises(HermesError, match="run this trial through one"):
        trial.config()


def test_runner_rejects_a_malformed_target() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hermes.trial.runner", "nofunction"], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0 and "usage" in result.stderr


def _suspended_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trial with a saver, suspended at step 2: its checkpoint of step 2 is committed."""
    first = Channel(tmp_path / "t1", monkeypatch)
    trial.Files(lambda directory: (directory / "kept").write_text("state"), lambda directory: None)
    first.answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.report(1, accuracy=0.5)
    with pytest.raises(trial.SuspendExit):
        trial.report(2, accuracy=0.6)
    return tmp_path / "t1" / protocol.CHECKPOINTS_DIR


def _damage_empty(root: Path) -> Path:
    (root / "step-2" / protocol.META_FILE).write_text("")
    return root / "step-2" / protocol.META_FILE


def _damage_step(root: Path) -> Path:
    (root / "step-2" / protocol.META_FILE).write_text('{"step": "x"}')
    return root / "step-2" / protocol.META_FILE


def _damage_pointer(root: Path) -> Path:
    (root / protocol.LATEST_FILE).unlink()
    (root / protocol.LATEST_FILE).mkdir()
    return root / protocol.LATEST_FILE


def _damage_pointer_zeros(root: Path) -> Path:
    (root / protocol.LATEST_FILE).write_bytes(b"\0" * 6)  # what a crash may leave of a file some filesystems wrote
    return root / protocol.LATEST_FILE


@pytest.mark.parametrize(
    ("damage", "reason"),
    [(_damage_empty, "it is empty"), (_damage_step, "its step is 'x', not a whole number"),
     (_damage_pointer, "Is a directory"), (_damage_pointer_zeros, "it names '")],
    ids=["empty", "step", "pointer", "pointer-of-zeros"],
)
def test_a_damaged_checkpoint_is_named_set_aside_and_the_trial_retrains_from_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], damage, reason: str,
) -> None:
    """Its metadata cut short, a step that is no number, ``latest`` replaced by a directory: the error names the
    file, rather than a JSONDecodeError the trial's code seems to raise; the damaged checkpoints are moved aside,
    never deleted, and the trial starts from scratch, as without a checkpoint (the executor answers the steps the
    scheduler has at once). Failing it would lose the trial for good, and running it again meets the same file."""
    root = _suspended_once(tmp_path, monkeypatch)
    damaged = damage(root)
    capsys.readouterr()

    resumed = Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_REPORTED_STEP: "2"})
    err = capsys.readouterr().err
    aside = tmp_path / "t1" / "checkpoints.damaged"
    assert err.startswith(f"hermes: trial t1: its checkpoint {damaged} is damaged ({reason}")
    assert f"moved to {aside}" in err and "it retrains from scratch (its steps up to 2 are trained again" in err
    assert (aside / "step-2" / "files" / "kept").read_text() == "state"  # nothing deleted
    assert not root.exists() and protocol.latest_checkpoint(tmp_path / "t1") is None
    moved = aside / damaged.relative_to(root)
    with pytest.raises(protocol.DamagedCheckpoint, match=f"checkpoint {moved} is damaged \\({reason}"):
        protocol.published_checkpoint(aside)  # what a report reading it says too
    assert trial.start_step() == 0
    files = trial.Files(lambda directory: None, lambda directory: pytest.fail("nothing to load"))
    assert files.restore() == 0
    resumed.answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.report(1, accuracy=0.5)
    with pytest.raises(trial.SuspendExit):
        trial.report(2, accuracy=0.6)
    assert protocol.latest_checkpoint(tmp_path / "t1") == (root / "step-2", 2)  # its new checkpoints work
    assert (aside / "step-2").is_dir()


def test_a_damaged_checkpoint_set_aside_leaves_the_trials_own_files_where_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its whole checkpoints/ folder was renamed checkpoints.damaged, its best model with it, and the trial's stderr
    said to delete that folder once no longer needed."""
    root = _suspended_once(tmp_path, monkeypatch)
    (root / "best").mkdir()
    (root / "best" / "model.txt").write_text("best so far")
    _damage_empty(root)
    resumed = Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_REPORTED_STEP: "2"})
    aside = tmp_path / "t1" / "checkpoints.damaged"
    assert sorted(path.name for path in aside.iterdir()) == [protocol.LATEST_FILE, "step-2"]
    assert sorted(path.name for path in root.iterdir()) == ["best"]
    assert (root / "best" / "model.txt").read_text() == "best so far"
    assert trial.start_step() == 0
    resumed.answer(protocol.SUSPEND)
    with pytest.raises(trial.SuspendExit):
        trial.report(1, accuracy=0.5)
    assert protocol.latest_checkpoint(tmp_path / "t1") == (root / "step-1", 1)
    assert (root / "best" / "model.txt").read_text() == "best so far"


def test_a_checkpoint_whose_state_file_was_cut_short_is_set_aside_and_the_trial_retrains_from_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """torch.load's "failed finding central directory" was an uncaught error of the trial: it crashed, ran again
    against the same file until its retries were spent, and failed, never naming the file."""
    first = Channel(tmp_path / "t1", monkeypatch)
    trial.Checkpoint(model=torch.nn.Linear(3, 2))
    first.answer(protocol.CONTINUE, protocol.SUSPEND)
    trial.report(1, accuracy=0.5)
    with pytest.raises(trial.SuspendExit):
        trial.report(2, accuracy=0.6)
    state = tmp_path / "t1" / protocol.CHECKPOINTS_DIR / "step-2" / "state" / "state.pt"
    with open(state, "r+b") as file:
        file.truncate(100)
    capsys.readouterr()

    resumed = Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_REPORTED_STEP: "2"})
    assert trial.Checkpoint(model=torch.nn.Linear(3, 2)).restore() == 0
    err = capsys.readouterr().err
    aside = tmp_path / "t1" / "checkpoints.damaged"
    assert err.startswith(f"hermes: trial t1: its checkpoint {state} is damaged (") and f"moved to {aside}" in err
    assert "it retrains from scratch (its steps up to 2 are trained again, not recorded again)" in err
    assert (aside / "step-2" / "state" / "state.pt").stat().st_size == 100  # kept, for whoever wants it
    resumed.answer(protocol.CONTINUE)
    trial.report(accuracy=0.5)
    assert resumed.received()[-1]["step"] == 1


def test_a_report_names_its_step_by_keyword_or_in_its_mapping(channel: Channel) -> None:
    """``report(step=10, loss=0.1)`` numbered the steps 1, 2, 3 itself and stored ``step`` as a metric."""
    channel.answer(protocol.CONTINUE, protocol.CONTINUE, protocol.CONTINUE)
    trial.report(step=3, accuracy=0.1)
    trial.report({"step": 5, "accuracy": 0.2})
    trial.report(6, accuracy=0.3)
    assert [(m["step"], m["metrics"]) for m in channel.received()] == [
        (3, {"accuracy": 0.1}), (5, {"accuracy": 0.2}), (6, {"accuracy": 0.3})]


@pytest.mark.parametrize("lose", ["trial dir", "latest", "checkpoints"])
def test_a_resume_whose_checkpoint_is_gone_says_it_retrains_from_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], lose: str,
) -> None:
    root = _suspended_once(tmp_path, monkeypatch)
    gone = {"trial dir": tmp_path / "t1", "latest": root / protocol.LATEST_FILE, "checkpoints": root}[lose]
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    capsys.readouterr()
    Channel(tmp_path / "t1", monkeypatch, **{protocol.ENV_REPORTED_STEP: "2"})  # which writes its config again
    missing = root if lose == "trial dir" else gone
    what = "its checkpoint is gone" if lose == "latest" else (  # a parked trial's were never written: not "gone"
        "it has no checkpoint on disk: none was written (a trial parked in its worker's memory when its run ended "
        "writes none), or they were deleted")
    assert capsys.readouterr().err == (
        f"hermes: trial t1: it resumes at step 2, but {what} (there is no {missing}); it retrains "
        "from scratch (its steps up to 2 are trained again, not recorded again)\n"
    )
    assert trial.start_step() == 0

    Channel(tmp_path / "t2", monkeypatch, **{protocol.ENV_REPORTED_STEP: "0"})  # a fresh start says nothing
    assert capsys.readouterr().err == ""


def test_a_first_report_past_the_budget_says_its_steps_count_iterations(channel: Channel) -> None:
    """It ended the trial as one past its budget, "completed", which then failed as one without a report."""
    with pytest.raises(ValueError, match=r"its first report was step 100, past budget.steps 10: steps count up to "
                                         r"the budget \(epochs, say\), not iterations"):
        trial.report(100, accuracy=0.5)
    assert channel.received() == []


def test_load_state_of_a_trial_without_a_checkpoint_says_it_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_state(result.best.checkpoint)`` (README) of a trial that committed no checkpoint, its
    storage.checkpoint_every past its steps, failed with a bare TypeError of pathlib."""
    monkeypatch.chdir(tmp_path)
    result = hermes.run(spec_of("no-checkpoint", search=search(1, 0, 0.0), budget={"steps": 2},
                                storage={"dir": "runs", "checkpoint_every": 10}))
    assert result.best is not None and result.best.checkpoint is None
    with pytest.raises(HermesError, match=r"checkpoint is None: the trial has no committed checkpoint \("
                                          r"storage.checkpoint_every is more than the steps it trained"):
        load_state(result.best.checkpoint)
