"""What a missing extra's error tells the user to install: Hermes is not on PyPI, where "hermes-hpo[ray]" would fetch
whatever package holds that name; the checkout it runs from is named instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # an import of it raises ImportError, as where it is not installed
from hermes.errors import HermesError
from hermes.ray.engine import connect
try:
    connect("auto", "ray.address")
except HermesError as error:
    print(error)
"""


def test_a_missing_extra_names_the_checkout_to_install_it_from() -> None:
    printed = subprocess.run([sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True, cwd=ROOT,
                             timeout=60, check=True).stdout
    assert printed.strip() == f"ray.address: Ray is not installed: pip install '{ROOT}[ray]'"
