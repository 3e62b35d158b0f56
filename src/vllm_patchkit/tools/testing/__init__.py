"""A lifecycle harness any patch set can use (after ddtrace's `PatchTestCase`).

For each patch of a set that the installed vLLM's manifest lists, each process role and
each import order, one fresh process runs the patch through patch / unpatch / patch twice
/ patch-unpatch-patch and checks the places by identity. The pytest plugin generates
these items from one ini line (`patchkit_sets = NAME`); `lifecycle_cases` and
`run_lifecycle` are the same API for a set's own tests. No import of pytest or vLLM here.
"""

from vllm_patchkit.tools.testing.cases import Case, LifecycleRun, lifecycle_cases, run_lifecycle
from vllm_patchkit.tools.testing.lifecycle import ORDERS, STEPS

__all__ = ["Case", "LifecycleRun", "ORDERS", "STEPS", "lifecycle_cases", "run_lifecycle"]
