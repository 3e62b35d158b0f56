"""Config-ready points: hand the process's VllmConfig to the loader before vLLM uses it.

Each is a wrap that runs the loader's config stage, then calls the original
with the arguments exactly as given.
"""

from __future__ import annotations

from vllm_patchkit import runtime


def before_vllm_config_post_init(original, *args, **kwargs):
    """Front end: act before VllmConfig.__post_init__ runs any of vLLM's own logic."""
    runtime.config_ready(args[0])
    return original(*args, **kwargs)


def before_executor_init(original, *args, **kwargs):
    """EngineCore: the executor is built right after the plugins load, before KV sizing and the scheduler."""
    runtime.config_ready(runtime.bound(original, args, kwargs, "vllm_config"))
    return original(*args, **kwargs)


def before_worker_init(original, *args, **kwargs):
    """Worker: WorkerBase.__init__ receives the config before the model runner exists."""
    runtime.config_ready(runtime.bound(original, args, kwargs, "vllm_config"))
    return original(*args, **kwargs)
