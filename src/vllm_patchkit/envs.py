"""Register declared env vars in vLLM's `vllm.envs.environment_variables`.

vLLM only knows variables listed there (and warns about unknown VLLM_* ones);
a plugin that reads a variable it never registered is undeclared behaviour.
"""

from __future__ import annotations

import os
from typing import Iterable

from .schema import EnvVar


def _reader(name: str, default):
    return lambda: os.environ.get(name, default)


def register(env_vars: Iterable[EnvVar]) -> list[str]:
    """Add each variable vLLM does not already declare; returns the names added."""
    try:
        import vllm.envs as venvs
    except Exception:
        return []
    added = []
    for ev in env_vars:
        if ev.name in venvs.environment_variables:
            continue
        venvs.environment_variables[ev.name] = _reader(ev.name, ev.default)
        added.append(ev.name)
    return added
