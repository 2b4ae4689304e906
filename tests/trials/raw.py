"""A command trial that speaks the executor's protocol itself, as a program in another language
would, and reports only a metric that is not the spec's objective.

    python raw.py          # run by the local executor, which passes HERMES_CHANNEL
"""

from __future__ import annotations

import json
import os


def main() -> None:
    answers, messages = (int(fd) for fd in os.environ["HERMES_CHANNEL"].split(","))
    report = {"type": "report", "step": 1, "metrics": {"accuracy": 0.5}, "checkpointed": False}
    os.write(messages, (json.dumps(report) + "\n").encode())
    print("answer:", os.read(answers, 100).decode().strip(), flush=True)  # none comes: it is killed


if __name__ == "__main__":
    main()
