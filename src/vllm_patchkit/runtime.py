"""The process's one loader, and the config-ready point the core hooks call."""

from __future__ import annotations

import logging
from typing import Any, Optional

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


def bound(original, args: tuple, kwargs: dict, name: str) -> Optional[Any]:
    """The value passed for parameter `name` in a call, however it was passed."""
    import inspect

    try:
        return inspect.signature(original).bind_partial(*args, **kwargs).arguments.get(name)
    except TypeError:
        return kwargs.get(name)


def note(patch_id: str, flush: bool = True, **detail: Any) -> bool:
    """Let an implementation put a per-call decision into its patch's record in this process.

    Rare events only (start-up decisions); per-step counters belong in a
    `Loader.detail_hooks` callable, copied at flush time. Returns False when no
    loader runs in this process (an implementation called outside the plugin).
    """
    rec = _loader.records.get(patch_id) if _loader is not None else None
    if rec is None:
        return False
    rec.detail.update(detail)
    if flush:
        _loader.flush()
    return True


def refuse(patch_id: str, message: str) -> bool:
    """Mark an applied patch `refused` because it refused at call time (then raise yourself)."""
    rec = _loader.records.get(patch_id) if _loader is not None else None
    if rec is None:
        return False
    rec.set("refused", "refused", message)
    _loader.flush()
    log.error("vllm-patchkit: %s refused: %s", rec.patch, message)
    return True
