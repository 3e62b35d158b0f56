"""A whole plugin's use of vLLM on one release, as values: one `Use` per place in the plugin's code that touches a
vLLM name, with the release's verdict on it (`ok`, `broken`, `guarded`, `not_followed`) and what the release has
there (`upstream`: how the name is defined, the signature a call or an override meets), which `differential.py`
compares between releases.

Read from: the imports (`imports.py`), the walk of every function (`walk.py`: attributes, methods, calls),
the signatures of what is called (`signatures.py`), the subclasses (`classes.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.reach_check import types_of
from vllm_patchkit.tools.reach_plugin.classes import overrides, unimplemented_abstract
from vllm_patchkit.tools.reach_plugin.imports import ImportUse, imports_of
from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules
from vllm_patchkit.tools.reach_plugin.signatures import callable_signature, misfit
from vllm_patchkit.tools.reach_plugin.walk import PluginTypes, walk
from vllm_patchkit.tools.static import StaticRelease

OK, BROKEN, GUARDED, NOT_FOLLOWED, OWN = "ok", "broken", "guarded", "not_followed", "own"


@dataclass(frozen=True)
class Use:
    """One touch of vLLM at the plugin's file:line. `kind`: import | attribute | method | call | override |
    abstract; `key`: the vLLM name (`module:name`, `module:Class.name`); `subject`: the plugin-side name when it is
    not the key (an override: the plugin's `module:Class.method`)."""

    kind: str
    key: str
    file: str
    line: int
    state: str
    why: str = ""
    upstream: str = ""
    subject: str = ""

    @property
    def ident(self) -> tuple:
        """What the same use is on another release (an override's base may be found on another class there)."""
        return (self.kind, self.file, self.line, self.subject or self.key)

    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v != ""}


@dataclass
class ReleaseReach:
    version: str
    uses: list[Use] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {OK: 0, GUARDED: 0, BROKEN: 0, NOT_FOLLOWED: 0}
        for u in self.uses:
            if u.state in out:
                out[u.state] += 1
        return out

    def followed_share(self) -> float:
        c = self.counts()
        judged = sum(c.values())
        return (judged - c[NOT_FOLLOWED]) / judged if judged else 1.0


def _import_use(types, imp: ImportUse) -> Use:
    defined = types.module_defines(imp.module, imp.name)
    if defined is not None:
        return Use("import", imp.key, imp.file, imp.line, OK, upstream=defined)
    gone = f"vLLM has no {imp.name} in {imp.module}"
    if imp.guard is not None:
        if imp.own_fallback:
            return Use("import", imp.key, imp.file, imp.line, GUARDED, f"{gone}; the handler provides a fallback")
        if imp.fallback and all(types.module_defines(m, n) for m, n, _ in imp.fallback):
            alt = ", ".join(f"{m}:{n} (line {line})" for m, n, line in imp.fallback)
            return Use("import", imp.key, imp.file, imp.line, GUARDED, f"{gone}; its fallback {alt} exists")
        if imp.fallback:
            alt = ", ".join(f"{m}:{n}" for m, n, _ in imp.fallback)
            gone += f", nor does its fallback {alt} exist"
    return Use("import", imp.key, imp.file, imp.line, BROKEN, gone + ": ImportError")


def read(plugin: PluginModules, release: StaticRelease) -> ReleaseReach:
    """Every use of vLLM in the plugin's modules, judged on `release` (read statically)."""
    from vllm_patchkit.tools.releases import StaticView

    types = types_of(StaticView(release))
    out = ReleaseReach(release.version() or "?")
    for mod in plugin.modules.values():
        out.uses += [_import_use(types, i) for i in imports_of(mod)]
    pt = PluginTypes(types, plugin)
    w = walk(plugin, pt)
    seen: set = set()
    for i in w.items_found():
        k = (i.kind, i.key, i.file, i.line)
        if k in seen:
            continue
        seen.add(k)
        if not i.followed:
            out.uses.append(Use(i.kind, i.key, i.file, i.line, NOT_FOLLOWED, f"the class of {i.owner} is not known"))
        elif i.member is None:
            what = "module has no" if i.kind == "import" else "defines no such name on"
            owner = Target.parse(i.owner).qualname if ":" in i.owner else i.owner  # a class, or a module
            out.uses.append(Use(i.kind, i.key, i.file, i.line, BROKEN, f"vLLM {what} {owner}: {i.name} is gone"))
        else:
            out.uses.append(Use(i.kind, i.key, i.file, i.line, OK, upstream=i.member.defined))
    for c in w.calls:
        k = ("call", c.callee, c.file, c.line, c.shape)
        if k in seen:
            continue
        seen.add(k)
        got = callable_signature(release, c.callee, c.how)
        if got is None:
            out.uses.append(Use("call", c.callee, c.file, c.line, NOT_FOLLOWED, "no signature in the release",
                                subject=c.shape.text()))
            continue
        sig, bound = got
        why = misfit(sig, bound, c.shape)
        out.uses.append(Use("call", c.callee, c.file, c.line, BROKEN if why else OK,
                            f"the call ({c.shape.text()}) against {sig}: TypeError: {why}" if why else "",
                            upstream=sig, subject=f"{c.callee}({c.shape.text()})"))
    for pc in pt.classes.values():
        file = plugin.modules[Target.parse(pc.spec).module].path
        for o in overrides(release, pc):
            subject = f"{o.cls}.{o.name}"
            if o.base is None:
                out.uses.append(Use("override", f"{pc.vllm_bases[0]}.{o.name}", file, o.line, OWN, upstream="absent",
                                    subject=subject))
                continue
            out.uses.append(Use("override", o.base, file, o.line, BROKEN if o.problems else OK,
                                "; ".join(o.problems), upstream=o.base_signature or "", subject=subject))
        for spec in unimplemented_abstract(release, pc):
            out.uses.append(Use("abstract", spec, file, pc.node.lineno, BROKEN,
                                f"{pc.spec} does not implement abstract method {spec.rpartition('.')[2]}: "
                                "constructing it raises TypeError", subject=f"{pc.spec}.{spec.rpartition('.')[2]}"))
    out.uses.sort(key=lambda u: (u.file, u.line, u.kind, u.key))
    return out


def broken(reach: ReleaseReach) -> list[Use]:
    return [u for u in reach.uses if u.state == BROKEN]


def by_ident(reach: ReleaseReach) -> dict[tuple, Use]:
    return {u.ident: u for u in reach.uses}


def find(reach: ReleaseReach, key: str, kind: Optional[str] = None) -> list[Use]:
    return [u for u in reach.uses if u.key == key and (kind is None or u.kind == kind)]


__all__ = ["BROKEN", "GUARDED", "NOT_FOLLOWED", "OK", "ReleaseReach", "Use", "broken", "by_ident", "read"]
