"""Fixtures of the contract tests (helpers in helpers.py)."""

from __future__ import annotations

import pytest

from .helpers import Scenario


@pytest.fixture
def scenario(tmp_path):
    def make(before: dict[str, str], after: dict[str, str], patches: list[dict]) -> Scenario:
        return Scenario(tmp_path, before, after, patches)

    return make
