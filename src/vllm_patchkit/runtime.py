"""The process's one loader, and the config-ready point the core hooks call."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("vllm.patchkit")

_loader = None
_config_done = False


def install(loader) -> None:
    global _loader, _config_done
    _loader, _config_done = loader, False


def current():
    return _loader


def config_ready(vllm_config: Any) -> None:
    """Run the config stage once per process, with the first full VllmConfig it sees."""
    global _config_done
    if _loader is None or _config_done:
        return
    mc = getattr(vllm_config, "model_config", None)
    if mc is None or getattr(mc, "is_submodel_config", False):
        return
    _config_done = True
    _loader.run_config_stage(vllm_config)


def reset() -> None:
    """Forget the loader (tests); does not unpatch."""
    install(None)
