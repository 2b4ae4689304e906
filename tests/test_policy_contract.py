"""The policy and stopper contract (``hermes.testing.policy_contract``) on every registered policy and stopper."""

from __future__ import annotations

import pytest

from hermes.policies import POLICIES, STOPPERS
from hermes.testing.policy_contract import *  # noqa: F401,F403


@pytest.fixture(params=sorted(POLICIES))
def policy_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(STOPPERS))
def stopper_name(request: pytest.FixtureRequest) -> str:
    return request.param
