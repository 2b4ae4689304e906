"""An unmodified training script: it knows nothing of Hermes and only prints its metrics.

    python examples/scripts/print_metrics.py --epochs 5 --lr 0.1
    epoch 1 loss 0.9048 accuracy 0.0952

Hermes reads the metrics with a pattern such as
``epoch (?P<step>\\d+) .* accuracy (?P<value>[-+]?(?:(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][-+]?\\d+)?|(?i:nan|inf(?:inity)?)\\b))``
(a number's sign and exponent, nan and inf too: ``[\\d.]+`` alone reads ``1e-05`` as 1) and suspends it with SIGSTOP.
"""

from __future__ import annotations

import argparse
import math
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epoch-seconds", type=float, default=0.05)
    args = parser.parse_args()
    loss = 1.0
    for epoch in range(1, args.epochs + 1):
        time.sleep(args.epoch_seconds)  # "training"
        loss *= math.exp(-args.lr)
        print(f"epoch {epoch} loss {loss:.4f} accuracy {1 - loss:.4f}")


if __name__ == "__main__":
    main()
