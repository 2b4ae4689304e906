"""A function trial whose model and optimizer live on the slot's CUDA device.

Config: ``seed``, ``megabytes`` (weights plus SGD momentum, float32). Each step is one SGD step
on a fixed random batch; it reports the loss, the device memory torch holds for tensors
(``allocated_mb``) and how many devices the trial sees (``devices``), so a test can tell whether
a parked trial's state left the device and whether the slot pinned one GPU.
"""

from __future__ import annotations

from typing import Any

from hermes import trial


def train(config: dict[str, Any]) -> None:
    import torch

    torch.manual_seed(int(config["seed"]))
    side = int((float(config["megabytes"]) * 2**20 / 4 / 2) ** 0.5)
    model = torch.nn.Linear(side, side, bias=False).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batch = torch.randn(8, side, device="cuda")
    state = trial.Checkpoint(model=model, optimizer=optimizer)
    for step in range(state.restore() + 1, trial.budget() + 1):
        optimizer.zero_grad()
        loss = model(batch).square().mean()
        loss.backward()
        optimizer.step()
        trial.report(
            step,
            loss=float(loss),
            allocated_mb=torch.cuda.memory_allocated() / 2**20,
            devices=float(torch.cuda.device_count()),
        )
