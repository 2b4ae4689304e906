"""What the spec check refuses about names and paths, which reached the run as tracebacks before: an experiment
named as one of the storage dir's own files, paths this machine cannot use (a name too long, a loop of links); and
trial functions in namespace packages (folders without ``__init__.py``), which it now finds."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.errors import SpecError
from hermes.experiment import load_spec
from hermes.experiment.locate import workdir_files
from hermes.session import STORE_FILE
from hermes.store.lock import LOCK_FILE, RESERVE_FILE
from tests.test_run import hermes

TAKEN = "must not be one of the files and folders Hermes keeps in a storage dir beside the experiments' own ("


def project(folder: Path, **changes: Any) -> Path:
    """A spec file in ``folder`` whose trial is ``quick:train`` there; ``changes`` replace its sections."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "quick.py").write_text("def train(config):\n    pass\n")
    spec = {
        "name": "quick",
        "trial": {"function": "quick:train", "workdir": "."},
        "search": {"trials": 1, "space": {"x": {"type": "uniform", "low": 0.0, "high": 1.0}}},
        "metric": {"name": "score", "mode": "max"},
        "budget": {"steps": 1},
        "resources": {"gpus": "none", "cpu_slots": 1},
        "storage": {"dir": "runs"},
        **changes,
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_hermes_run_refuses_a_name_hermes_keeps_in_the_storage_dir_before_writing_anything(tmp_path: Path) -> None:
    """`--name hermes.db` made runs/hermes.db/trials/0 in the store's file: NotADirectoryError, a failed experiment."""
    path = project(tmp_path)
    given = hermes("run", str(path), "--name", STORE_FILE, "--no-live", cwd=tmp_path)
    assert (given.returncode, given.stdout) == (2, "")
    assert given.stderr.startswith(f"hermes: error: the name given in place of the spec's (--name), {STORE_FILE!r}: "
                                   f"{TAKEN}")
    assert given.stderr.count("\n") == 1
    path = project(tmp_path, name=LOCK_FILE)
    written = hermes("run", str(path), "--no-live", cwd=tmp_path)
    assert (written.returncode, written.stdout) == (2, "")
    assert written.stderr.startswith(f"hermes: error: {path}: name: {TAKEN}")
    assert written.stderr.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["quick.py", "spec.yaml"]


@pytest.mark.parametrize("name", [STORE_FILE, f"{STORE_FILE}-journal", f"{STORE_FILE}-wal", f"{STORE_FILE}-shm",
                                  LOCK_FILE, RESERVE_FILE, "plots", "pool", "users", "Hermes.DB"])
def test_a_name_hermes_keeps_in_the_storage_dir_is_refused_in_the_spec_and_in_place_of_it(
    tmp_path: Path, name: str
) -> None:
    """SQLite's files, the runner's lock and reserve, `hermes plot`'s folder, a server root's pool and users' areas;
    in any case, which a file system that ignores it (macOS's) reads as the same name."""
    path = project(tmp_path)
    with pytest.raises(SpecError) as given:
        load_spec(path, name)
    assert [field for field, _ in given.value.problems] == ["name"]
    assert given.value.problems[0][1].startswith(TAKEN)
    with pytest.raises(SpecError, match=f"^{re.escape(f'{path}: name: {TAKEN}')}"):
        load_spec(project(tmp_path, name=name))
    assert load_spec(path, f"{name}2").name == f"{name}2"  # only the names themselves


LONG = "b" * 300  # longer than a name may be on any common file system (255 bytes)


@pytest.mark.parametrize("field", ["trial.workdir", "storage.dir", "storage.uri"])
@pytest.mark.parametrize(("written", "problem"), [
    pytest.param(LONG, "name too long for the file system; shorten it", id="long"),
    pytest.param(f"{LONG}/runs", "name too long for the file system; shorten it", id="long/runs"),
    pytest.param("loop", "a symbolic link loop; fix or remove the link", id="loop"),
    pytest.param("loop/runs", "a symbolic link loop; fix or remove the link", id="loop/runs"),
])
def test_a_path_this_machine_cannot_use_is_refused_with_its_field(
    tmp_path: Path, field: str, written: str, problem: str
) -> None:
    """OSError: File name too long from is_dir(), or RuntimeError: Symlink loop from resolve(), was a traceback
    (a 500 on the server)."""
    (tmp_path / "loop").symlink_to("loop")
    section, key = field.split(".")
    path = project(tmp_path, **{section: {**({"function": "quick:train"} if section == "trial" else {}), key: written}})
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value) == f"{path}: {field}: {tmp_path / written} cannot be used: {problem}"


@pytest.mark.parametrize(("made", "problem"), [
    pytest.param(lambda folder: folder.symlink_to(folder.name), "cannot be used: a symbolic link loop; fix or remove "
                 "the link", id="loop"),
    pytest.param(lambda folder: folder.write_text(""), ", the experiment's folder, is not a directory; move it away",
                 id="file"),
])
def test_an_experiment_folder_this_machine_cannot_use_is_refused_before_the_run(
    tmp_path: Path, made: Any, problem: str
) -> None:
    """<storage dir>/<name> as a link loop was a RuntimeError traceback from the local executor once the store had
    the experiment; as a file, every trial failed ("cannot make its folder")."""
    path = project(tmp_path)
    folder = tmp_path / "runs" / "quick"
    folder.parent.mkdir()
    made(folder)
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value) == f"{path}: storage.dir: {folder}{' ' if problem[0] != ',' else ''}{problem}"
    assert sorted(os.listdir(folder.parent)) == ["quick"]


def test_a_home_this_machine_does_not_have_is_refused_with_its_field(tmp_path: Path) -> None:
    """~user of no user: RuntimeError from expanduser(), a traceback."""
    path = project(tmp_path, storage={"dir": "~hermes-no-such-user/runs"})
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value) == (f"{path}: storage.dir: '~hermes-no-such-user/runs': this machine has no home folder "
                                 "for ~hermes-no-such-user; give the path in full")


def test_hermes_run_refuses_a_workdir_whose_links_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hermes.cli import main

    (tmp_path / "loop").symlink_to("loop")
    path = project(tmp_path, trial={"function": "quick:train", "workdir": "loop"})
    assert main(["run", str(path), "--no-live"]) == 2
    assert capsys.readouterr().err == (f"hermes: error: {path}: trial.workdir: {tmp_path / 'loop'} cannot be used: a "
                                       "symbolic link loop; fix or remove the link\n")
    assert not (tmp_path / "runs").exists()


def test_a_trial_function_in_nested_namespace_packages_is_found_without_importing_it(tmp_path: Path) -> None:
    """Folders without __init__.py, as Python imports them: KeyError 'ns1' from PathFinder before, which reads a
    namespace package's parent from sys.modules."""
    code = tmp_path / "code"
    (code / "ns1" / "ns2").mkdir(parents=True)
    module = code / "ns1" / "ns2" / "mod.py"
    module.write_text("RAN = open(__file__ + '.ran', 'w')\ndef train(config):\n    pass\n")

    def spec_of(function: str) -> Path:
        return project(tmp_path, trial={"function": function, "workdir": "code"})

    assert load_spec(spec_of("ns1.ns2.mod:train")).trial.function == "ns1.ns2.mod:train"
    with pytest.raises(SpecError, match=re.escape(f"trial.function: module ns1.ns2.mod ({module}) defines no 'trian'")):
        load_spec(spec_of("ns1.ns2.mod:trian"))
    missing = f"trial.function: package ns1.ns2 ({module.parent}) has no module 'nope'"
    with pytest.raises(SpecError, match=re.escape(missing)):
        load_spec(spec_of("ns1.ns2.nope:train"))
    # the server confines each of them to the user's area
    assert workdir_files("ns1.ns2.mod:train", code) == [code / "ns1", code / "ns1" / "ns2", module]
    assert not Path(f"{module}.ran").exists()  # found, not imported
