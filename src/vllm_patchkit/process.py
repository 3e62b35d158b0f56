"""Which vLLM process is this? Told by who called the plugin entry point.

vLLM calls `load_general_plugins()` from a known place in each process, so the
caller's frame is a reliable role signal; process titles are set later in some
processes and not at all in others.
"""

from __future__ import annotations

import os
import sys

ROLE_ENV = "VLLM_PATCHKIT_ROLE"

# (path fragment of the calling file, function name) -> role
_CALLERS = (
    (os.path.join("v1", "engine", "core.py"), "__init__", "engine_core"),
    (os.path.join("v1", "worker", "worker_base.py"), "init_worker", "worker"),
    (os.path.join("model_executor", "models", "registry.py"), "_run", "inspect"),
)


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
