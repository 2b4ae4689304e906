"""The workload every system in ``compare.py`` tunes: a PyTorch MLP on enlarged scikit-learn digits.

The data are the digits example's (``examples/digits/train.py``): 360 clean validation images and
14 shifted, noisy copies of the other 1437 (20,118 training images), so an epoch takes a few
tenths of a second on one thread. Training is deterministic: a configuration's ``seed`` fixes
initialisation and shuffling, and every system runs torch on one thread, so the same
configuration reaches the same accuracies whichever system trains it, on one machine. Across
machines it does not: torch picks its CPU kernels by the instruction set, their float sums round
differently, and a curve drifts off after a few epochs (``machine`` names what decides;
docs/benchmarks.md, "Why the workload moved between machines").
"""

from __future__ import annotations

import functools
import platform
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from examples.digits.train import VALIDATION, enlarge, load_digits
from hermes import trial

COPIES = 14  # noisy copies of the training images: ~20k samples
WIDTHS = (16, 32, 64, 128)
BATCH_SIZES = (16, 32, 64, 128)
# The space ``configurations`` draws from, in a Hermes spec's terms: what a searcher explores (``--search tpe``).
SPACE: dict[str, dict[str, Any]] = {
    "lr": {"type": "loguniform", "low": 1e-3, "high": 1.0},
    "width": {"type": "choice", "values": list(WIDTHS)},
    "weight_decay": {"type": "loguniform", "low": 1e-6, "high": 1e-2},
    "batch_size": {"type": "choice", "values": list(BATCH_SIZES)},
    "momentum": {"type": "uniform", "low": 0.0, "high": 0.95},
}
SEARCH_SEED = 0  # the torch seed of every searched configuration: the same values train the same in every system


def configurations(n: int = 48, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` configurations drawn from the digits search space, deterministic in ``seed``.

    Each configuration's values are drawn in turn from one stream, so the first ``k`` of
    ``configurations(n)`` are ``configurations(k)``: a smaller comparison runs a prefix of a larger one.
    """
    rng = np.random.RandomState(seed)
    configs = []
    for _ in range(n):
        configs.append(
            {
                "lr": float(np.exp(rng.uniform(np.log(1e-3), np.log(1.0)))),
                "width": int(rng.choice(WIDTHS)),
                "weight_decay": float(np.exp(rng.uniform(np.log(1e-6), np.log(1e-2)))),
                "batch_size": int(rng.choice(BATCH_SIZES)),
                "momentum": float(rng.uniform(0.0, 0.95)),
                "seed": int(rng.randint(2**31)),
            }
        )
    return configs


@functools.lru_cache(maxsize=1)
def dataset() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_val, y_val), prepared once per process: a warm worker running many
    trials pays for it once. The split is the digits example's."""
    features, labels = load_digits()
    order = np.random.RandomState(0).permutation(len(labels))
    features, labels = features[order], labels[order]
    train_features, train_labels = enlarge(features[VALIDATION:], labels[VALIDATION:], COPIES)
    return (
        torch.tensor(train_features / 16.0, dtype=torch.float32),
        torch.tensor(train_labels),
        torch.tensor(features[:VALIDATION] / 16.0, dtype=torch.float32),
        torch.tensor(labels[:VALIDATION]),
    )


class Trainer:
    """One configuration's model and optimizer, trained an epoch at a time.

    ``model`` and ``optimizer`` are what a checkpoint must hold (with the global RNGs, which
    shuffle the batches): Hermes saves them through ``trial.Checkpoint``.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        torch.set_num_threads(1)  # one thread per slot, in every system
        self.x_train, self.y_train, self.x_val, self.y_val = dataset()
        torch.manual_seed(int(config["seed"]))
        width = int(config["width"])
        self.model = nn.Sequential(
            nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
        )
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=float(config["lr"]),
            momentum=float(config["momentum"]),
            weight_decay=float(config["weight_decay"]),
        )
        self.batch_size = int(config["batch_size"])

    def train_epoch(self) -> tuple[float, float]:
        """Train one epoch and evaluate; return (validation accuracy, wall seconds both took)."""
        start = time.perf_counter()
        self.model.train()
        for batch in torch.randperm(len(self.y_train)).split(self.batch_size):
            self.optimizer.zero_grad()
            nn.functional.cross_entropy(self.model(self.x_train[batch]), self.y_train[batch]).backward()
            self.optimizer.step()
        self.model.eval()
        with torch.no_grad():
            accuracy = (self.model(self.x_val).argmax(dim=1) == self.y_val).float().mean().item()
        return accuracy, time.perf_counter() - start


def machine() -> dict[str, str]:
    """What decides the workload's float results besides its code: torch's version and the instruction
    set its CPU kernels use (AVX2, AVX512, ...). Runs that differ here train different curves from the
    first few epochs on, so their figures are compared with each other only."""
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "architecture": platform.machine(),
    }


def configuration(index: int) -> dict[str, Any]:
    """Configuration ``index`` of ``configurations()``: what a system that passes only the index trains."""
    return configurations(index + 1)[index]


def searched(params: dict[str, Any]) -> dict[str, Any]:
    """The configuration a searcher's proposal (values of ``SPACE``) trains: the values and the fixed seed."""
    return {**{name: params[name] for name in SPACE}, "seed": SEARCH_SEED}


def hermes_trial(config: dict[str, Any]) -> None:
    """A Hermes function trial (``bench.frameworks.workload:hermes_trial``): configuration ``config["index"]``,
    or, without an index, the searched values in ``config``.

    The grid's spec lists each configuration with its index; the trial trains the one of that index,
    so that every system trains exactly the same configuration.
    """
    trainer = Trainer(configuration(int(config["index"])) if "index" in config else searched(config))
    state = trial.Checkpoint(model=trainer.model, optimizer=trainer.optimizer)
    for epoch in range(state.restore(), trial.budget()):
        accuracy, seconds = trainer.train_epoch()
        trial.report(epoch + 1, accuracy=accuracy, train_seconds=seconds)
