"""What a trial puts in its checkpoints: torch state, random generators, arbitrary files.

Each ``Saver`` registers with the trial's session when it is created and owns one subdirectory
(its ``name``) of every checkpoint. The session decides when to checkpoint (at every suspend and
every ``checkpoint_every`` steps) and commits all parts atomically together.
"""

from __future__ import annotations

import json
import pickle
import random
import sys
import weakref
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable

from hermes.errors import HermesError
from hermes.trial import protocol
from hermes.trial.session import Session, current


class Saver(ABC):
    """One part of the trial's checkpoint, saved into and loaded from its own directory."""

    def __init__(self, name: str) -> None:
        if not name or "/" in name or name.startswith(".") or name == protocol.META_FILE:
            raise HermesError(f"invalid checkpoint part name {name!r}")
        self.name = name
        self._checked: Path | None = None  # the checkpoint whose part ``_check`` found sound
        session = current()  # in a warm worker, several trials' savers live in one process
        # Weak: the session keeps its savers, and a cycle would hold the trial's model in its warm worker after the
        # trial ended, until Python's cyclic collector happens to run (numpy's and torch's memory never prompts it).
        self._session = weakref.ref(session)
        session.register(self)

    @property
    def session(self) -> Session:
        session = self._session()
        if session is None:
            raise HermesError(f"the trial of checkpoint part {self.name!r} has ended: a saver serves its trial only")
        return session

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write this part into ``directory`` (it exists and is empty)."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Read back what ``save`` wrote into ``directory``."""

    def offload(self) -> None:
        """The trial parks in a warm worker: move what this part holds off the device (no-op by default)."""

    def reload(self) -> None:
        """The parked trial resumes: move back what ``offload`` moved."""

    def _check(self, checkpoint: Path) -> None:
        """Raise DamagedCheckpoint where this part of ``checkpoint`` (a checkpoint's folder) cannot be loaded, and
        change nothing of the trial: ``restore`` checks every part before it loads any. Here: that its folder is
        there, where the checkpoint lists it (written, then lost)."""
        if not (checkpoint / self.name).is_dir() and self.name in _parts(checkpoint):
            raise protocol.DamagedCheckpoint(checkpoint / self.name, "it is missing")

    def forget_check(self) -> None:
        """The trial reported without restoring this part (an export kept apart, say): drop what ``_check`` read."""

    def restore(self) -> int:
        """Load this part from the trial's newest checkpoint; return that checkpoint's step (0 when fresh).

        Every part the trial has is checked before the first is loaded, whichever restores first: a damaged part
        found once another was loaded would leave that one's state in the trial, which retrains from scratch."""
        session = self.session
        latest = protocol.latest_checkpoint(session.directory)
        if latest is None:
            return 0
        directory, step = latest
        try:
            for saver in list(session.savers.values()):
                if saver._checked != directory:
                    saver._check(directory)
                    saver._checked = directory
            if not (directory / self.name).is_dir():
                raise HermesError(f"the checkpoint of step {step} has no part {self.name!r}: create every saver "
                                  "before the first report")
            self.load(directory / self.name)
        except protocol.DamagedCheckpoint as damage:
            session.unreadable(damage)
            return 0
        session.note_restored()
        return step


def _parts(directory: Path) -> list[str]:
    """The parts a checkpoint was saved with, as its metadata lists them (none in one older than that list)."""
    meta = json.loads((directory / protocol.META_FILE).read_text())
    return list(meta.get("parts", []))


class Checkpoint(Saver):
    """PyTorch state (anything with ``state_dict``/``load_state_dict``: models, optimizers, LR
    schedulers, grad scalers) and, with ``rng``, the state of every global random generator, which
    bitwise-exact resumption needs (shuffling, dropout and initialisation draw from them)."""

    def __init__(self, *, name: str = "state", rng: bool = True, **objects: Any) -> None:
        for key, value in objects.items():
            if not (hasattr(value, "state_dict") and hasattr(value, "load_state_dict")):
                raise TypeError(f"{key}: {type(value).__name__} has no state_dict/load_state_dict")
        self.objects = objects
        self.rng = rng
        self._devices: dict[str, Any] = {}  # object -> the device it was offloaded from
        self._state: tuple[Path, dict[str, Any]] | None = None  # what ``_check`` read, and from where, for ``load``
        super().__init__(name)

    def save(self, directory: Path) -> None:
        rng = None
        if self.rng:  # a parked trial's own generators, not those of the trial running meanwhile
            rng = self.session.parked_rng or capture_rng()
        state = {"objects": {key: value.state_dict() for key, value in self.objects.items()}, "rng": rng}
        if sys.modules.get("torch") is not None:  # imported (a half-done import in another thread is waited for)
            import torch

            torch.save(state, directory / _TORCH_FILE)
        else:  # torch is an optional extra: with it not loaded, nothing of it is in the state, and pickle keeps it all
            (directory / _PICKLE_FILE).write_bytes(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))

    def offload(self) -> None:
        """Move modules and optimizer state on a CUDA device to host memory, so a parked trial
        holds none of the device's memory. Parameters keep their identity (``Module.to`` swaps
        their data), so optimizers still point at them."""
        if sys.modules.get("torch") is None:  # not imported here: its import takes seconds, and one not loaded holds no GPU
            return
        import torch  # as in ``save``

        if not torch.cuda.is_initialized():
            return
        for key, value in self.objects.items():
            device = _device_of(value)
            if device is not None and device.type == "cuda":
                self._devices[key] = device
                _move(value, torch.device("cpu"))

    def reload(self) -> None:
        for key, device in self._devices.items():
            _move(self.objects[key], device)
        self._devices.clear()

    def _check(self, checkpoint: Path) -> None:
        """Read the state of this part (kept for ``load``): a file cut short is found only so."""
        super()._check(checkpoint)
        if (checkpoint / self.name).is_dir():
            self._state = checkpoint / self.name, self._read(checkpoint / self.name)

    def forget_check(self) -> None:
        self._state = None

    def load(self, directory: Path) -> None:
        state = self._state[1] if self._state is not None and self._state[0] == directory else self._read(directory)
        self._state = None
        for key, value in self.objects.items():
            if key not in state["objects"]:
                raise HermesError(f"{_state_file(directory)} holds no {key!r} (it holds "
                                  f"{', '.join(map(repr, state['objects'])) or 'nothing'}): the trial's Checkpoint "
                                  "names its objects as when it was saved")
            value.load_state_dict(state["objects"][key])
        if state["rng"] is not None:
            restore_rng(state["rng"])

    @staticmethod
    def _read(directory: Path) -> dict[str, Any]:
        """The state saved in ``directory``; DamagedCheckpoint where none can be read from it."""
        path = _state_file(directory)
        if not path.is_file():  # lost (a crash before its rename cannot leave this: a folder is renamed whole)
            raise protocol.DamagedCheckpoint(directory, f"neither {_TORCH_FILE} nor {_PICKLE_FILE} is there")
        try:
            state = _read_state(path)
        except ImportError:  # a sound checkpoint that this environment lacks a module to read (torch, numpy)
            raise
        except Exception as error:  # cut short (a crash, a full disk), or overwritten: no state can come of it
            raise protocol.DamagedCheckpoint(path, f"{type(error).__name__}: {error}") from None
        if not (isinstance(state, dict) and isinstance(state.get("objects"), dict) and "rng" in state):
            raise protocol.DamagedCheckpoint(path, "not a state that trial.Checkpoint wrote")
        return state


def load_state(checkpoint: str | Path | None, name: str = "state") -> dict[str, Any]:
    """The state dicts a trial's ``Checkpoint`` saved in ``checkpoint`` (a checkpoint's folder, as
    ``hermes.run``'s ``result.best.checkpoint`` gives it), by the names the trial gave its objects; outside a
    trial, to use the winner: ``model.load_state_dict(load_state(result.best.checkpoint)["model"])``."""
    if checkpoint is None:  # result.best.checkpoint of a trial that committed none
        raise HermesError("checkpoint is None: the trial has no committed checkpoint (storage.checkpoint_every is more "
                          "than the steps it trained, or it created no trial.Checkpoint); set checkpoint_every to at "
                          "most the steps a trial trains")
    path = _state_file(Path(checkpoint) / name)
    if not path.is_file():
        raise HermesError(f"{path.with_name(_TORCH_FILE)} (or {_PICKLE_FILE}) is not there: is {checkpoint} a "
                          f"checkpoint's folder, and {name!r} the name of the trial's Checkpoint?")
    return dict(_read_state(path)["objects"])


_TORCH_FILE = "state.pt"  # what Checkpoint writes where torch is loaded
_PICKLE_FILE = "state.pkl"  # and where it is not


def _state_file(directory: Path) -> Path:
    """The file a Checkpoint saved in ``directory``: ``state.pt``, else ``state.pkl`` (which need not exist)."""
    path = directory / _TORCH_FILE
    return path if path.is_file() else directory / _PICKLE_FILE


def _read_state(path: Path) -> Any:
    """What Checkpoint saved in ``path``: our own file, so unpickling it is safe; tensors go to the CPU first so a
    checkpoint moves between devices (``load_state_dict`` copies into the tensors' current device)."""
    if path.name == _TORCH_FILE:
        import torch

        return torch.load(path, map_location="cpu", weights_only=False)
    return pickle.loads(path.read_bytes())


class Files(Saver):
    """Arbitrary files: ``save(directory)`` writes them, ``load(directory)`` reads them back."""

    def __init__(self, save: Callable[[Path], None], load: Callable[[Path], None], *, name: str = "files") -> None:
        self._save_files = save
        self._load_files = load
        super().__init__(name)

    def save(self, directory: Path) -> None:
        self._save_files(directory)

    def load(self, directory: Path) -> None:
        self._load_files(directory)


def _device_of(value: Any) -> Any:
    """The device of a module's parameters or of an optimizer's state; None when it holds no tensor."""
    import torch

    if isinstance(value, torch.nn.Module):
        return next((p.device for p in value.parameters()), None)
    if isinstance(value, torch.optim.Optimizer):
        tensors = (t for state in value.state.values() for t in state.values() if torch.is_tensor(t))
        return next((t.device for t in tensors if t.dim() > 0), None)
    return None


def _move(value: Any, device: Any) -> None:
    import torch

    if isinstance(value, torch.nn.Module):
        value.to(device)
    elif isinstance(value, torch.optim.Optimizer):
        for state in value.state.values():
            for name, tensor in state.items():
                if torch.is_tensor(tensor) and tensor.dim() > 0:  # scalar steps stay on the host
                    state[name] = tensor.to(device)


def capture_rng() -> dict[str, Any]:
    """The state of the global random generators in use: Python's, NumPy's and torch's (CPU, CUDA)."""
    state: dict[str, Any] = {"python": random.getstate()}
    # Imported by the trial (a half-done import in another thread is waited for, as in ``Checkpoint.save``)
    if sys.modules.get("numpy") is not None:
        import numpy

        state["numpy"] = numpy.random.get_state()
    if sys.modules.get("torch") is not None:
        import torch

        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.device_count() == len(state["cuda"]):
            torch.cuda.set_rng_state_all(state["cuda"])


def reseed_rng() -> None:
    """Seed the global random generators of ``capture_rng`` from the system's entropy, as a process of its own starts
    with them: a trial that starts in a warm worker must not draw on where the worker's previous trial left off."""
    random.seed()
    if sys.modules.get("numpy") is not None:  # as in ``capture_rng``
        import numpy

        numpy.random.seed()
    if sys.modules.get("torch") is not None:
        import torch

        torch.seed()  # the CPU's and every device's
