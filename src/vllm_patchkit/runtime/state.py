"""The process's one loader, and the config-ready point the core hooks call."""

from __future__ import annotations

import logging
from typing import Any, Optional

log = logging.getLogger("vllm.patchkit")

_loader = None
_config_done = False
_counters: dict[str, dict[str, int]] = {}
_counted = 0  # bumped at every count(): the flusher writes when it changed


def install(loader) -> None:
    global _loader, _config_done
    _loader, _config_done = loader, False


def current():
    return _loader


def config_ready(vllm_config: Any, role: Optional[str] = None) -> None:
    """Run the config stage once per process, with the first full VllmConfig it sees; at another role's
    config-ready point (`role`: its code runs in this process too), that role's patches (hosting.py)."""
    global _config_done
    if _loader is None:
        return
    mc = getattr(vllm_config, "model_config", None)
    if mc is None or getattr(mc, "is_submodel_config", False):
        return
    if role is not None and role != _loader.role:
        _loader.host(role, vllm_config)
        return
    if _config_done:
        return
    _config_done = True
    _loader.run_config_stage(vllm_config)


def reset() -> None:
    """Forget the loader and the components' counters (tests); does not unpatch."""
    global _counted
    install(None)
    _counters.clear()
    _counted = 0


def count(source: str, name: str, n: int = 1) -> None:
    """Add to a counter of a plugin component that is not a patch (e.g. `count("my_plugin.copier",
    "restores_right")`), so it shows in this process's record, `vllm-patchkit status` and /metrics next to the
    patches' counters. Cheap (a dict update); written by the flusher with the record."""
    global _counted
    mine = _counters.setdefault(source, {})
    mine[name] = mine.get(name, 0) + n
    _counted += 1


def counters() -> tuple[int, dict[str, dict[str, int]]]:
    """(how many counts so far, a copy of the counters): what the next flush writes."""
    return _counted, {src: dict(names) for src, names in list(_counters.items())}

