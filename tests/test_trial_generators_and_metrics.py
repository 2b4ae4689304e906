"""A spilled trial's savers read its own random generators, while another trial computes in the worker on its own; a
metric that float() cannot hold is no number. Real warm workers, a real executor, real pipes."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from hermes import trial
from hermes.core.decisions import Resume, Start
from hermes.core.events import TrialExited, TrialReported
from hermes.local import LocalExecutor, TrialLaunch, local_slots
from tests.test_trial_api import Channel
from tests.test_warm_trial_edges import LIMITS, module, park
from tests.test_warm_workers import until_ended

# Ported code's checkpoint (Hugging Face's rng_state, say): a Files saver that pickles the global generators. The
# trial that moves waits, in its spill's saver, for the one that computes in the same worker to draw meanwhile.
PICKLES_GENERATORS = """
    import pickle
    import random
    import threading

    import numpy as np
    import torch

    from hermes import trial

    SAVING, DRAWN = threading.Event(), threading.Event()  # of the worker: a spill under way; the other trial drew


    def train(config):
        for seed in (random.seed, np.random.seed, torch.manual_seed):
            seed(config["seed"])
        state = {"total": 0.0}

        def save(directory):
            if config["role"] == "moves":
                SAVING.set()
                assert DRAWN.wait(10)
            with open(directory / "state.pkl", "wb") as file:
                pickle.dump({"total": state["total"], "python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}, file)

        def load(directory):
            with open(directory / "state.pkl", "rb") as file:
                saved = pickle.load(file)
            state["total"] = saved["total"]
            random.setstate(saved["python"])
            np.random.set_state(saved["numpy"])
            torch.set_rng_state(saved["torch"])

        start = trial.Files(save, load).restore()
        for step in range(start + 1, trial.budget() + 1):
            computes_while_the_other_spills = config["role"] == "computes" and step == 2
            if computes_while_the_other_spills:
                assert SAVING.wait(10)
            state["total"] += random.random() + np.random.rand() + torch.rand(()).item()
            if computes_while_the_other_spills:
                DRAWN.set()
            trial.report(step, total=state["total"])
"""


def never_suspended(seed: int, steps: int) -> list[float]:
    """The totals of ``PICKLES_GENERATORS``' trial of ``seed`` run in one go."""
    python, numpy, torch_generator = random.Random(seed), np.random.RandomState(seed), torch.Generator()
    torch_generator.manual_seed(seed)
    totals, total = [], 0.0
    for _ in range(steps):
        total += python.random() + numpy.rand() + torch.rand((), generator=torch_generator).item()
        totals.append(total)
    return totals


@pytest.mark.timeout(60)
def test_a_files_saver_that_pickles_the_generators_resumes_a_moved_trial_exactly(tmp_path: Path) -> None:
    """Its spill's savers ran on the worker's live generators, those of the trial that last computed there: the moved
    trial went on with that trial's streams (17 of 24 reports differed in a round-robin run). Putting the parked
    generators in place meanwhile would have changed the draws of the trial that computes then, in another thread."""
    function = module(tmp_path, "pickles_generators", PICKLES_GENERATORS)
    with LocalExecutor(tmp_path / "run", slots=local_slots(cpu_slots=2), metric="total", limits=LIMITS) as executor:
        executor.next_events()  # the node's NodeAdded
        for trial_id, seed in (("moves", 1), ("computes", 2)):
            executor.submit(trial_id, TrialLaunch(3, function=function, config={"seed": seed, "role": trial_id},
                                                  cwd=str(tmp_path)))
        executor.apply(Start("moves", "local/cpu0"), executor.now())
        park(executor, "moves")
        executor.apply(Start("computes", "local/cpu0"), executor.now())  # the same worker: it computes there
        executor.apply(Resume("moves", "local/cpu1", migrated=True), executor.now())  # spilled on cpu0 meanwhile
        events = until_ended(executor, 2)
    assert [(e.trial_id, e.succeeded, e.error) for e in events if isinstance(e, TrialExited)] in (
        [("moves", True, None), ("computes", True, None)], [("computes", True, None), ("moves", True, None)])
    for trial_id, seed in (("moves", 1), ("computes", 2)):
        reported = [e.metrics["total"] for e in events if isinstance(e, TrialReported) and e.trial_id == trial_id]
        expected = never_suspended(seed, 3)
        assert reported == (expected[1:] if trial_id == "moves" else expected), trial_id  # bitwise: ==, not approx


def test_a_metric_that_a_float_cannot_hold_is_left_out_or_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An int of 10**400 (OverflowError) or a complex tensor (RuntimeError) crashed the trial with a traceback, where
    a metric besides the objective that is no number is left out, said once; numpy's complex lost its imaginary part.
    The objective's error names it and says why."""
    channel = Channel(tmp_path / "t1", monkeypatch)
    channel.answer("continue")
    trial.report(1, accuracy=0.5, count=10**400, spectrum=torch.tensor(1 + 2j), phase=np.complex128(1 + 2j),
                 huge=10**5000)  # whose repr Python refuses (over 4300 digits)
    assert [message["metrics"] for message in channel.received()] == [{"accuracy": 0.5}]
    ten = "1" + "0" * 79
    assert capsys.readouterr().err.splitlines() == [
        f"hermes: trial t1: its metric {name!r} is left out: the store keeps numbers, it reported {shown}"
        for name, shown in (("count", f"int {ten} (int too large to convert to float)"),
                            ("spectrum", "Tensor tensor(1.+2.j)"), ("phase", "complex128 np.complex128(1+2j)"),
                            ("huge", "int (int too large to convert to float)"))
    ]
    with pytest.raises(TypeError, match=r"^metric 'accuracy' must be a number, got int 1000.* \(int too large to "):
        trial.report(2, accuracy=10**400)
    assert channel.received() == []
