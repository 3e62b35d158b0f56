"""A live place against its pin: the one comparison the loader runs in every process (verify, subclass) and whose
words `check` and `pin` share (a difference is explained per parameter by sigdiff and judged for the patch by
compat).

Kind, signature, source and value are compared exactly: any difference refuses the patch (the implementation's
convention and `ctx.arg` are judged against the pinned signature). The return shape is judged, not compared: a
shape the patch survives (it hands the result on untouched) is no mismatch, as `check` calls it compatible, never
stale; one it depends on refuses it, in the words `check` uses."""

from __future__ import annotations

from typing import Any, Optional

import msgspec

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.declaration.pins import Fingerprint


def compare(spec: str, pin: Fingerprint, live: Fingerprint, value: Any = None,
             patch: Optional[Patch] = None) -> Optional[Finding]:
    for name in ("kind", "signature", "source_digest", "value_digest"):
        want, got = getattr(pin, name), getattr(live, name)
        if name in ("source_digest", "value_digest") and want is None:
            continue
        if want != got:
            if name == "value_digest":
                now = repr(value)
                now = now if len(now) <= 80 else now[:77] + "..."
                return Finding("fingerprint", f"{spec}: value changed since it was pinned (now {now})", want, got)
            # the words `check` uses: one Breakage per difference, explained per parameter
            # (decorator layers are judged separately, as conflicts); imported here, on a mismatch only: it
            # brings the static reader along (~5 ms at every process's start-up otherwise)
            from vllm_patchkit.upstream.sigdiff import compare as diff_pins

            found = diff_pins(patch.key if patch else "", spec, msgspec.structs.replace(pin, wrappers=[]),
                              msgspec.structs.replace(live, wrappers=[]))
            if patch is not None:  # judged for this patch, in the words `check` and `pin` use
                from vllm_patchkit.upstream.compat import judge_all

                found = judge_all(patch, found)
                reason = "; ".join(f"{b.explain()} ({b.verdict()})" for b in found)
                if found and not any(b.breaking for b in found):
                    reason += ("; every difference is compatible for this patch, but pins are compared exactly: "
                               "re-pin the release (`vllm-patchkit pin`)")
            else:
                reason = "; ".join(b.explain() for b in found)
            reason = reason or f"{spec}: {name} differs from the pin"
            return Finding("fingerprint", reason, want, got, found)
    if pin.return_shape is not None and pin.return_shape != live.return_shape:
        return _shape_changed(spec, pin, live, patch)
    return None


def _shape_changed(spec: str, pin: Fingerprint, live: Fingerprint, patch: Optional[Patch]) -> Optional[Finding]:
    """Only the return shape differs: a finding when it breaks the patch (or no patch is at hand to judge it)."""
    from vllm_patchkit.upstream.sigdiff import compare as diff_pins

    found = diff_pins(patch.key if patch else "", spec, msgspec.structs.replace(pin, wrappers=[]),
                      msgspec.structs.replace(live, wrappers=[]))
    if patch is not None:
        from vllm_patchkit.upstream.compat import judge_all

        found = judge_all(patch, found)
        if not any(b.breaking for b in found):
            return None  # a shape this patch survives: applied, as `check` says compatible
    reason = "; ".join(f"{b.explain()} ({b.verdict()})" if patch else b.explain() for b in found)
    return Finding("fingerprint", reason, pin.return_shape, live.return_shape, found)
