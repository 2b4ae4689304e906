"""A function trial that forks as training code does: a DataLoader with worker processes, and a program it
runs that reads its stdin. Each step reports the share of the data the loader's workers gave it, and the
number of bytes the program read on its stdin."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from hermes import trial


def train(config: dict) -> None:
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2)
    for step in range(1, trial.budget() + 1):
        seen = sum(len(batch) for (batch,) in loader)  # forks two workers every epoch
        read = subprocess.run([sys.executable, "-c", "import sys; print(len(sys.stdin.read()))"],
                              capture_output=True, text=True, timeout=30, check=True).stdout
        trial.report(step, seen=seen / 64, stdin=float(read))
