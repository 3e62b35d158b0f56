"""Fixtures shared by the core tests."""

from __future__ import annotations

import sys
import textwrap
import uuid

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


@pytest.fixture
def impl_module(tmp_path, monkeypatch):
    """Write an implementation module (a unique name per call) and return its import name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made = []

    def write(source: str) -> str:
        name = f"impl_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        made.append(name)
        return name

    yield write
    for name in made:
        sys.modules.pop(name, None)
