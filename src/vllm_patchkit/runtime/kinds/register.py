"""`register`: one entry of a mapping vLLM looks keys up in (a run-time registry such as
MODEL_ARCH_CONFIG_CONVERTORS: hf model_type -> convertor class) is set to `value` or what `value_from` names.
Undo puts back vLLM's entry, or removes the key the patch added."""

from __future__ import annotations

from vllm_patchkit.runtime.applied import ENTRY_BY, Applied
from vllm_patchkit.runtime.kinds.base import PatchKind


class Register(PatchKind):
    name = "register"
    changes_target = True  # it waits for the mapping's module like a patch at a place
    installed_name = "entry"

    def apply(self, patch, verified, record, flush):
        mapping, key = verified.place.get_raw(), patch.entry
        value = verified.impl if patch.value_from is not None else patch.value
        had, old = key in mapping, mapping.get(key)
        mapping[key] = value
        ENTRY_BY[(id(mapping), key)] = patch.key

        def restore() -> None:
            if ENTRY_BY.get((id(mapping), key)) == patch.key:
                del ENTRY_BY[(id(mapping), key)]
            if had:
                mapping[key] = old
            else:
                mapping.pop(key, None)

        return Applied(patch, restore=restore), {"entry": f"{patch.target}[{key!r}]"}


KIND = Register()
