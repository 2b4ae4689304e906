"""What a trial puts in its checkpoints: torch state, random generators, arbitrary files.

Each ``Saver`` registers with the trial's session when it is created and owns one subdirectory
(its ``name``) of every checkpoint. The session decides when to checkpoint (at every suspend and
every ``checkpoint_every`` steps) and commits all parts atomically together.
"""

from __future__ import annotations

import random
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable

from hermes.errors import HermesError
from hermes.trial import protocol
from hermes.trial.session import current


class Saver(ABC):
    """One part of the trial's checkpoint, saved into and loaded from its own directory."""

    def __init__(self, name: str) -> None:
        if not name or "/" in name or name.startswith(".") or name == protocol.META_FILE:
            raise HermesError(f"invalid checkpoint part name {name!r}")
        self.name = name
        current().register(self)

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write this part into ``directory`` (it exists and is empty)."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Read back what ``save`` wrote into ``directory``."""

    def restore(self) -> int:
        """Load this part from the trial's newest checkpoint; return that checkpoint's step (0 when fresh)."""
        latest = protocol.latest_checkpoint(current().directory)
        if latest is None:
            return 0
        directory, step = latest
        if not (directory / self.name).is_dir():
            raise HermesError(
                f"the checkpoint of step {step} has no part {self.name!r}: create every saver before the first report"
            )
        self.load(directory / self.name)
        return step


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
        super().__init__(name)

    def save(self, directory: Path) -> None:
        import torch

        state = {
            "objects": {key: value.state_dict() for key, value in self.objects.items()},
            "rng": capture_rng() if self.rng else None,
        }
        torch.save(state, directory / "state.pt")

    def load(self, directory: Path) -> None:
        import torch

        # Our own file, so unpickling is safe; on the CPU first so a checkpoint moves between
        # devices (load_state_dict copies into the tensors' current device).
        state = torch.load(directory / "state.pt", map_location="cpu", weights_only=False)
        for key, value in self.objects.items():
            value.load_state_dict(state["objects"][key])
        if state["rng"] is not None:
            restore_rng(state["rng"])


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


def capture_rng() -> dict[str, Any]:
    """The state of the global random generators in use: Python's, NumPy's and torch's (CPU, CUDA)."""
    state: dict[str, Any] = {"python": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
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
