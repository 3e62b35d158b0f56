"""`subclass`: the implementation, a subclass of the target class, is selected through `config_field` at the
config stage; the loader then watches that vLLM really builds it (`not_built`)."""

from __future__ import annotations

import logging

from vllm_patchkit.runtime import subclass
from vllm_patchkit.runtime.kinds.base import PatchKind, Skip, counting
from vllm_patchkit.upstream.findings import Finding

log = logging.getLogger("vllm.patchkit")


class Subclass(PatchKind):
    name = "subclass"
    installed_name = "subclass"

    def choose(self, patch, verified, vllm_config):
        sel = subclass.select(patch, vllm_config, verified.impl, verified.place.get_raw())
        if isinstance(sel, Finding):
            return sel
        if sel.skip is not None:
            return Skip(sel.skip.code, sel.skip.reason, sel.skip.expected, sel.skip.found)
        verified.selection, verified.already = sel, sel.already
        return verified

    def apply(self, patch, verified, record, flush):
        applied = subclass.install(patch, verified.impl, verified.selection, counting(patch))
        return applied, subclass.describe(patch, verified.selection)

    def report(self, applied, record, steps):
        """A selected subclass of which vLLM built no object once the engine stepped: it changes nothing."""
        patch = applied.patch
        record.detail["built"] = applied.counter.calls if applied.places else "not counted"
        if (steps and applied.places and applied.counter.calls == 0
                and not any(f.get("code") == "not_built" for f in record.findings)):
            record.findings.append(Finding("not_built", f"{patch.config_field} selects {patch.implementation}, but "
                                           f"vLLM built none after {steps} steps: the overrides never run",
                                           where=patch.implementation).as_record())
            log.warning("vllm-patchkit: %s: %s is selected but vLLM never built it", record.patch,
                        patch.implementation)


KIND = Subclass()
