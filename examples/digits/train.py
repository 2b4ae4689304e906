"""A function trial: a two-hidden-layer MLP on scikit-learn's digits, with PyTorch.

Run by Hermes as ``examples.digits.train:train``. It reports validation accuracy after every
epoch and resumes bitwise-exactly: model, optimizer and random generators are checkpointed, and
the seed in the config fixes initialisation and shuffling.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hermes import trial

VALIDATION = 360  # of the 1797 digits, the same ones for every trial


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The data of ``sklearn.datasets.load_digits``, read from the file scikit-learn ships.

    Importing scikit-learn takes about two seconds, paid again at every resume, so the file is
    read directly.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits example needs scikit-learn installed (it ships the data)")
    data = np.loadtxt(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def enlarge(images: np.ndarray, labels: np.ndarray, copies: int) -> tuple[np.ndarray, np.ndarray]:
    """``copies`` noisy copies of each image, shifted by up to a pixel: a bigger training set, same task.

    Fixed by its own seed, so every trial and every resume sees the same data.
    """
    rng = np.random.RandomState(1)
    squares = images.reshape(-1, 8, 8)
    out = []
    for _ in range(copies):
        dy, dx = rng.randint(-1, 2, size=2)
        shifted = np.roll(np.roll(squares, dy, axis=1), dx, axis=2)
        out.append(np.clip(shifted + rng.normal(0.0, 1.0, shifted.shape), 0.0, 16.0).reshape(-1, 64))
    return np.concatenate(out), np.tile(labels, copies)


def train(config: dict[str, Any]) -> None:
    torch.manual_seed(int(config.get("seed", 0)))
    features, labels = load_digits()
    order = np.random.RandomState(0).permutation(len(labels))
    features, labels = features[order], labels[order]
    train_features, train_labels = features[VALIDATION:], labels[VALIDATION:]
    copies = int(config.get("copies", 1))  # > 1: an enlarged training set (the validation set stays clean)
    if copies > 1:
        train_features, train_labels = enlarge(train_features, train_labels, copies)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the slot's GPU (CUDA_VISIBLE_DEVICES)
    x_val = torch.tensor(features[:VALIDATION] / 16.0, dtype=torch.float32, device=device)
    y_val = torch.tensor(labels[:VALIDATION], device=device)
    x_train = torch.tensor(train_features / 16.0, dtype=torch.float32, device=device)
    y_train = torch.tensor(train_labels, device=device)

    width = int(config.get("width", 64))
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    model.to(device)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=float(config.get("lr", 0.05)),
        momentum=float(config.get("momentum", 0.9)),
        weight_decay=float(config.get("weight_decay", 0.0)),
    )
    batch_size = int(config.get("batch_size", 32))
    state = trial.Checkpoint(model=model, optimizer=optimizer)

    for epoch in range(state.restore(), trial.budget()):
        model.train()
        loss_sum = 0.0
        for batch in torch.randperm(len(y_train)).split(batch_size):  # on the CPU's generator, wherever it trains
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(batch)
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_val).argmax(dim=1) == y_val).float().mean().item()
        trial.report(epoch + 1, accuracy=accuracy, loss=loss_sum / len(y_train))

    torch.save(model.state_dict(), trial.trial_dir() / "model.pt")
