"""vllm-patchkit's public API: what a patch set's code and its tests import; every other module is internal.

Each name is imported on first use (PEP 562 `__getattr__`), because vLLM's general-plugin entry point
imports this package in every process at start-up and a name a role never uses must cost it nothing.
docs/writing-a-patch.md shows each in use; tests/house/test_public_api.py holds the shipped set and
tests/plugins/otherset to these names.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

#: public name -> (internal module, its name there)
_EXPORTS: dict[str, tuple[str, str]] = {
    # a patch's implementation
    "PatchContext": ("vllm_patchkit.runtime.context", "PatchContext"),
    "count": ("vllm_patchkit.runtime.state", "count"),
    "model_matches": ("vllm_patchkit.declaration.preconditions", "model_matches"),
    "ProbeAnswer": ("vllm_patchkit.upstream.findings", "ProbeAnswer"),
    # what a set raises, and what start-up raises for it
    "PatchkitError": ("vllm_patchkit.declaration.errors", "PatchkitError"),
    "Refusal": ("vllm_patchkit.declaration.errors", "Refusal"),
    "RequiredPatchFailed": ("vllm_patchkit.declaration.errors", "RequiredPatchFailed"),
    # the set's source, returned by its `vllm_patchkit.patch_sets` entry point
    "PatchSetSource": ("vllm_patchkit.declaration.patchsets", "PatchSetSource"),
    "PATCH_SETS_GROUP": ("vllm_patchkit.declaration.patchsets", "GROUP"),
    "discover_sets": ("vllm_patchkit.declaration.patchsets", "discover"),
    # a set's tests: the lifecycle harness, and a real server over a tiny local model
    "Case": ("vllm_patchkit.tools.testing", "Case"),
    "LifecycleRun": ("vllm_patchkit.tools.testing", "LifecycleRun"),
    "ORDERS": ("vllm_patchkit.tools.testing", "ORDERS"),
    "STEPS": ("vllm_patchkit.tools.testing", "STEPS"),
    "lifecycle_cases": ("vllm_patchkit.tools.testing", "lifecycle_cases"),
    "run_lifecycle": ("vllm_patchkit.tools.testing", "run_lifecycle"),
    "serve": ("vllm_patchkit.tools.serve.server", "serve"),
    "ServerError": ("vllm_patchkit.tools.serve.server", "ServerError"),
    "build_tiny_model": ("vllm_patchkit.tools.serve.tiny_model", "build_tiny_model"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'vllm_patchkit' has no attribute {name!r}") from None
    value = getattr(import_module(module), attr)
    globals()[name] = value  # the next look-up is a plain global
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and editors see; nothing is imported at run time
    from vllm_patchkit.declaration.errors import PatchkitError, Refusal, RequiredPatchFailed
    from vllm_patchkit.declaration.patchsets import GROUP as PATCH_SETS_GROUP
    from vllm_patchkit.declaration.patchsets import PatchSetSource
    from vllm_patchkit.declaration.patchsets import discover as discover_sets
    from vllm_patchkit.declaration.preconditions import model_matches
    from vllm_patchkit.runtime.context import PatchContext
    from vllm_patchkit.runtime.state import count
    from vllm_patchkit.tools.serve.server import ServerError, serve
    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model
    from vllm_patchkit.tools.testing import ORDERS, STEPS, Case, LifecycleRun, lifecycle_cases, run_lifecycle
    from vllm_patchkit.upstream.findings import ProbeAnswer
