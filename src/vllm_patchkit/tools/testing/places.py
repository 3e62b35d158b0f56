"""The assertions of a lifecycle case: patched places, restored originals, records and status file.

Split from lifecycle.py so the steps read as a story and the checks as a list. Each
function records its checks on the case (`lc.check`); none raises on a failed check, so a
case reports every broken expectation, not the first.
"""

from __future__ import annotations

import json
import os
import sys

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.runtime.kinds import kind_named
from vllm_patchkit.runtime.wrappers import MARK
from vllm_patchkit.tools.testing.snapshot import ImportSnapshot, layers
from vllm_patchkit.upstream.targets import function_of


def specs(p) -> list[str]:
    """Every place a patch touches or reads: target, declared copies, used callables."""
    return ([p.target] if p.target else []) + list(p.copies) + list(getattr(p, "uses", []) or [])



def expected_state(p) -> str:
    return "refused" if kind_named(p.kind.value).refuses else "applied"


def check_patched(lc, loaders, snap: ImportSnapshot, outcome, refusal_raised: bool = True) -> None:
    """The newest loader's record says applied (or refused, naming the patch); every place is patched."""
    c = lc.check
    rec = loaders[-1].records[lc.patch.id]
    want = expected_state(lc.patch)
    if not c(rec.state == want, f"{lc.patch.key} is {want}",
             {"state": rec.state, "code": rec.code, "reason": rec.reason, "expected": rec.expected, "found": rec.found}):
        return
    if want == "refused" and refusal_raised:
        c(outcome is not None and lc.patch.key in str(outcome), "start-up refused naming the patch", str(outcome))
    for p in lc.closure:
        prec = loaders[-1].records[p.id]
        if p is not lc.patch:
            # a dependency of another process (the worker's config-ready point for a patch of EngineCore and
            # workers, run as EngineCore) is not needed here: skipped for its process, and nothing else
            elsewhere = prec.state == "skipped" and prec.code == "process"
            c(prec.state in ("applied", "refused") or elsewhere, f"required {p.key} is {prec.state}", prec.reason)
        _check_places(lc, p, prec, snap, patched=prec.state == "applied")
    _check_status_file(lc, loaders[-1])


def _check_places(lc, p, rec, snap: ImportSnapshot, patched: bool) -> None:
    from vllm_patchkit.upstream.targets import TargetError, resolve

    c = lc.check
    if p.target is None:
        return
    original = snap.originals.get(p.target)
    target_raw = resolve(p.target, import_module=False).get_raw()
    if not (traits(p).installs_function and patched):
        c(target_raw is original, f"{p.target} untouched ({p.kind.value})", repr(target_raw)[:120])
        if p.env_default is not None and patched:
            c(os.environ.get(p.env_default.name) == p.env_default.value,
              f"{p.env_default.name}={p.env_default.value} set", os.environ.get(p.env_default.name))
        return
    n = layers(target_raw)
    c(n == 1, f"{p.target}: exactly one {MARK} layer", n, code="one_layer")
    c(getattr(function_of(target_raw), MARK, None) == p.key, f"{p.target}: the layer is {p.key}",
      getattr(function_of(target_raw), MARK, None))
    c(getattr(function_of(target_raw), "__wrapped__", None) is function_of(original), f"{p.target}: wraps the original by identity",
      repr(getattr(function_of(target_raw), "__wrapped__", None))[:120])
    c(type(target_raw) is type(original), f"{p.target}: descriptor kind kept", type(target_raw).__name__)
    places = rec.detail.get("places") or []
    c(p.target in places, f"{p.key} record lists its places", places)
    for spec in p.copies:
        mod = Target.parse(spec).module
        if mod not in sys.modules:
            lc.notes.append(f"{spec}: module not imported at this point (it takes the patched object when it imports)")
            continue
        try:
            held = resolve(spec, import_module=False).get_raw()
        except TargetError as exc:
            c(False, f"copy {spec} resolvable", str(exc))
            continue
        late = snap.imported_by.get(mod, "").startswith("after-patch")
        c(held is target_raw, f"copy {spec} holds the patched object" + (" (imported after the first patch)" if late else ""),
          repr(held)[:120], code="late_copy_repatched" if late else "copy_patched")
        c(layers(held) == 1, f"copy {spec}: exactly one layer", layers(held), code="one_layer")


def _check_status_file(lc, loader) -> None:
    path = loader.flush()
    if not lc.check(path is not None and path.is_file(), "status record written", str(path)):
        return
    data = json.loads(path.read_text())
    on_disk = {r["patch"]: r["state"] for r in data["patches"]}
    in_memory = {r.patch: r.state for r in loader.records.values()}
    lc.check(on_disk == in_memory, "status file agrees with the records", {"disk": on_disk, "memory": in_memory})


def check_restored(lc, snap: ImportSnapshot, env_before: dict, loaders=(), label="originals restored") -> None:
    """Every place of the closure holds its original by identity; env back; records say unpatched."""
    from vllm_patchkit.upstream.targets import TargetError, resolve


    c = lc.check
    for p in lc.closure:
        for spec in specs(p):
            mod = Target.parse(spec).module
            if mod not in sys.modules:
                continue
            want = snap.originals.get(p.target) if spec in p.copies else snap.originals.get(spec)
            try:
                raw = resolve(spec, import_module=False).get_raw()
            except TargetError as exc:
                c(False, f"{label}: {spec} resolvable", str(exc))
                continue
            late_copy = spec in p.copies and snap.imported_by.get(mod, "").startswith("after-patch")
            code = "late_copy_restored" if late_copy else "restored"
            c(raw is want, f"{label}: {spec} holds the original" + (" (copy imported after patching)" if late_copy else ""),
              {"layers": layers(raw), "held": repr(raw)[:100]}, code=code)
    for name, value in env_before.items():
        c(os.environ.get(name) == value, f"{label}: env {name} back to {value!r}", os.environ.get(name))
    for loader in loaders:
        for p in lc.closure:
            rec = loader.records[p.id]
            if (traits(p).installs_function or traits(p).sets_value or p.env_default is not None) and rec.state != "skipped":
                c(rec.state == "pending" and rec.reason == "unpatched", f"{label}: {p.key} record says unpatched",
                  {"state": rec.state, "reason": rec.reason})
