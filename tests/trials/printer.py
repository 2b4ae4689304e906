"""An unmodified program: it knows nothing of Hermes and only prints its metrics, one line a step.

    python printer.py --steps 8 --rate 0.5 --sleep 0.1
    step 1 loss 0.6065 score 0.3935 pid 4242

With ``--nan`` it prints ``nan`` as its score; with ``--crash-at N`` it exits with code 1 during step N; with
``--log`` its lines go through ``logging``, to stderr; ``--first-step N`` numbers its steps from N. The pid shows that a suspended run was resumed
(SIGCONT), not started again.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--sleep", type=float, default=0.1)
    parser.add_argument("--nan", action="store_true")
    parser.add_argument("--crash-at", type=int)
    parser.add_argument("--log", action="store_true")
    parser.add_argument("--first-step", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for step in range(1, args.steps + 1):
        time.sleep(args.sleep)
        if step == args.crash_at:
            raise SystemExit(f"crashed in step {step}")
        value = math.nan if args.nan else 1.0 - math.exp(-args.rate * step)
        line = f"step {step + args.first_step - 1} loss {1.0 - value:.4f} score {value:.4f} pid {os.getpid()}"
        if args.log:
            logging.info(line)
        else:
            print(line, flush=True)


if __name__ == "__main__":
    main()
