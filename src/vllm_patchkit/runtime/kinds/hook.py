"""`hook`: a plugin class vLLM reaches without the framework (the plugin registers it in a vLLM registry, names it
in an entry point, or hands vLLM its dotted path), whose methods vLLM calls: each method in `overrides` is judged
against the base method's pin, as a subclass's are (`runtime/subclass.check`). Nothing is installed: the record says
that the calls vLLM makes still fit, or the finding that they do not, before vLLM makes the first one."""

from __future__ import annotations

from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.kinds.base import PatchKind


class Hook(PatchKind):
    name = "hook"
    changes_target = True  # verified once the base class's module is imported
    installed_name = "hook class"

    def apply(self, patch, verified, record, flush):
        return Applied(patch), {"hooks": [f"{patch.implementation}.{m}" for m in patch.overrides],
                                "installed": "nothing: vLLM reaches the class through the plugin's own registration"}


KIND = Hook()
