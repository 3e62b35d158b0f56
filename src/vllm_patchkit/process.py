"""Which vLLM process is this? Told by who called the plugin entry point.

vLLM calls `load_general_plugins()` from a known place in each process, so the
caller's frame is a reliable role signal; process titles are set later in some
processes and not at all in others.
"""

from __future__ import annotations

import os
import sys

ROLE_ENV = "VLLM_PATCHKIT_ROLE"

# The callers of `load_general_plugins()` that tell the roles apart, as `module:Qualname` specs.
# Each is pinned as a `uses` of the framework's config-ready hook of that role (src/vllm_patchkit/core/),
# so `vllm-patchkit check` and the manifests catch it when vLLM moves or renames it
# (tests/core/test_plugin.py checks the two lists agree).
CALLERS = (
    ("vllm.v1.engine.core:EngineCore.__init__", "engine_core"),
    ("vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker", "worker"),
    ("vllm.model_executor.models.registry:_run", "inspect"),
)


def _frame_key(spec: str) -> tuple[str, str]:
    """(file path suffix, function name) of a spec, matched against a frame's code."""
    module, _, qualname = spec.partition(":")
    return os.path.join(*module.split(".")) + ".py", qualname.rpartition(".")[2]


_CALLERS = tuple((*_frame_key(spec), role) for spec, role in CALLERS)


def detect_role(max_depth: int = 40) -> str:
    """Role of this process from the call stack; $VLLM_PATCHKIT_ROLE wins when set."""
    forced = os.environ.get(ROLE_ENV)
    if forced:
        return forced
    frame = sys._getframe(1)
    depth = 0
    while frame is not None and depth < max_depth:
        code = frame.f_code
        for fragment, func, role in _CALLERS:
            if code.co_name == func and code.co_filename.endswith(fragment):
                return role
        frame = frame.f_back
        depth += 1
    return "frontend"
