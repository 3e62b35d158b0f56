"""Config-ready points: hand the process's VllmConfig to the loader before vLLM uses it.

Each is a wrap that runs the loader's config stage, then calls the original
with the arguments exactly as given. Where the config sits in the call is
declared in the YAML (`params: [vllm_config]`) and read through the context.
"""

from __future__ import annotations

from vllm_patchkit.reporting import gather
from vllm_patchkit.runtime import state as runtime


def before_vllm_config_post_init(wrapped, instance, args, kwargs):
    """Front end: act before VllmConfig.__post_init__ runs any of vLLM's own logic (the instance is the config)."""
    runtime.config_ready(instance, "frontend")
    return wrapped(*args, **kwargs)


def before_executor_init(wrapped, instance, args, kwargs, ctx):
    """EngineCore: the executor is built right after the plugins load, before KV sizing and the scheduler (in the
    front end too when it runs EngineCore in-process: runtime/hosting.py)."""
    runtime.config_ready(ctx.arg(args, kwargs, "vllm_config"), "engine_core")
    return wrapped(*args, **kwargs)


def before_worker_init(wrapped, instance, args, kwargs, ctx):
    """Worker: WorkerBase.__init__ receives the config before the model runner exists. The worker then
    answers `collective_rpc("vllm_patchkit_records")` (gather.py): how the API server sees workers on
    other hosts. In EngineCore (the uni executor) or the front end, the worker's code runs in that process
    (runtime/hosting.py)."""
    runtime.config_ready(ctx.arg(args, kwargs, "vllm_config"), "worker")
    out = wrapped(*args, **kwargs)
    gather.attach(instance)
    return out
