"""Register declared env vars in vLLM's `vllm.envs.environment_variables`.

vLLM only knows variables listed there (and warns about unknown VLLM_* ones);
a plugin that reads a variable it never registered is undeclared behaviour.
"""

from __future__ import annotations

import os
from typing import Iterable

from vllm_patchkit.declaration.schema import EnvVar


def _reader(name: str, default):
    return lambda: os.environ.get(name, default)


def _constant(default):
    return lambda: default


def register(env_vars: Iterable[EnvVar], constant: bool = False) -> list[str]:
    """Add each variable vLLM does not already declare; returns the names added.

    vLLM hashes the value of every registered variable into its torch.compile cache
    key (`vllm.envs.compile_factors`). The framework's own knobs (a run id that is new
    for every server start, a per-user status path) must never be part of that key,
    or every start recompiles the model: with `constant=True` they are registered
    (so vLLM does not warn about an unknown VLLM_* variable) with a getter that
    returns their default. Nothing reads them through `vllm.envs`.
    """
    try:
        import vllm.envs as venvs
    except Exception:
        return []
    added = []
    for ev in env_vars:
        if ev.name in venvs.environment_variables:
            continue
        venvs.environment_variables[ev.name] = _constant(ev.default) if constant else _reader(ev.name, ev.default)
        added.append(ev.name)
    return added
