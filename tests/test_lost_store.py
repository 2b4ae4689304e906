"""A store that is lost (deleted, emptied, or copied without its -wal file) while the experiment's folder holds the
trials of an earlier run: `hermes run` made a new experiment in silence, and each trial's start deleted the
checkpoints of the earlier run. It is refused in a line that says what to do. Real runs, a real store."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from hermes import run as hermes_run
from hermes.errors import HermesError
from tests.test_run import hermes as hermes_command_line
from tests.test_run import run_ok, search, spec_of, write_spec

LOST = ("deleted", "emptied")  # how the store is lost


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("how", LOST)
def test_a_run_whose_store_was_lost_is_refused_and_keeps_the_earlier_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    path = write_spec(tmp_path, spec_of("lost", search=search(2, 0, 0.0), budget={"steps": 3},
                                        storage={"dir": "runs", "checkpoint_every": 1}))
    run_ok(path)
    storage = (tmp_path / "runs").resolve()
    trials = storage / "lost" / "trials"
    kept = files_under(trials)
    assert any("/checkpoints/" in name for name in kept), kept
    for name in ("hermes.db-wal", "hermes.db-shm"):
        (storage / name).unlink(missing_ok=True)
    if how == "deleted":
        (storage / "hermes.db").unlink()
    else:
        (storage / "hermes.db").write_bytes(b"")

    refused = hermes_command_line("run", str(path), "--no-live", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        f"hermes: error: {storage / 'hermes.db'} holds no experiment lost, but {trials} holds the trials of an "
        "earlier run of it: its store was lost (deleted, emptied, or copied without its hermes.db-wal file); put the "
        "store back with its -wal file to continue it, run it under another --name or storage.dir, or remove "
        f"{storage / 'lost'} to start it over\n")
    assert files_under(trials) == kept  # no checkpoint deleted, nothing run again
    assert not (storage / "hermes.db-wal").exists()  # the store it opened was closed whole

    monkeypatch.chdir(tmp_path)
    with pytest.raises(HermesError, match=re.escape(f"holds no experiment lost, but {trials} holds the trials")):
        hermes_run(path)
    assert files_under(trials) == kept

    shutil.rmtree(storage / "lost")  # what the error says starts it over
    assert "\nlost: finished; store " in run_ok(path).stdout
