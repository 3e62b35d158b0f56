"""Fixtures shared by the core tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def undo_every_loader(request, monkeypatch):
    """Every loader the test module's `make_loader` makes is unpatched afterwards, whatever the test asserted."""
    from . import helpers

    made = []

    def tracking(*args, **kwargs):
        made.append(helpers.make_loader(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(request.module, "make_loader", tracking)
    yield
    for loader in reversed(made):
        loader.unpatch()
