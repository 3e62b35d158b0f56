"""What a scan finds: one `Site` per place where a plugin changes vLLM, and the `ScanResult` around them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from vllm_patchkit.declaration.names import Target

#: How a plugin changes vLLM at a site (the scan's vocabulary; the corpus catalogue's mechanisms map onto it).
MECHANISMS = (
    "setattr",            # an attribute of a vLLM module/class set to something (a literal, an object)
    "class_swap",         # a vLLM module/class attribute set to a plugin class
    "replace",            # a vLLM callable set to a plugin function that never calls the original
    "wrap",               # a vLLM callable set to a wrapper of itself (X.m = w(X.m), a closure calling the original)
    "functools_wraps",    # a wrapper built with functools.wraps(<vLLM callable>)
    "wrapt",              # wrapt.wrap_function_wrapper / patch_function_wrapper / wrap_object on a vLLM path
    "instance_attr",      # a method set on an object (types.MethodType): vLLM objects built at run time
    "sys_modules",        # sys.modules["vllm...."] edited
    "config_field",       # a config field that selects a class (scheduler_cls, worker_cls, ...) set
    "subclass_override",  # a subclass of a vLLM class overriding one of its methods
    "registry",           # a registration through one of vLLM's registries
    "env",                # a VLLM_* environment variable set or defaulted
    "copy_body",          # a plugin function whose body is a copy of a vLLM function's
    "refuse",             # a raise in a method overriding a vLLM hook (or in what it calls): vLLM stops there
    "parse_error",        # a file that does not parse (a finding, not a crash)
)


def placed(place: Optional[str]) -> Optional[Target]:
    """The target a site names once the scan placed it at the release; None for none, or for a name it could
    not place (a dotted path, a bare module)."""
    return Target.parse(place) if place and ":" in place else None


@dataclass
class Site:
    """One place: where in the plugin, what in vLLM, and how the patch schema can state it."""

    mechanism: str
    file: str
    line: int
    dotted: Optional[str] = None        # the vLLM object reached, as a dotted path (vllm.a.b.C.m)
    target: Optional[str] = None        # module:Qualname at the release (where the plugin writes)
    defined_at: Optional[str] = None    # module:Qualname where the release defines it (if elsewhere)
    what: str = ""                      # one line: what the plugin puts there
    declare: Optional[str] = None       # wrap | replace | set | env_default | refuse | subclass, or None
    hints: dict[str, Any] = field(default_factory=dict)   # schema fields the draft fills (instances, value, ...)
    notes: list[str] = field(default_factory=list)        # facts a reviewer needs (calls super(), similarity)
    reason: Optional[str] = None        # why not declarable (declare is None)
    writes: list[str] = field(default_factory=list)       # registry: the vLLM tables the registration stores into
    facts: dict[str, Any] = field(default_factory=dict, repr=False)  # scanner internals (not reported)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def place(self) -> Optional[str]:
        return self.target or self.dotted

    @property
    def target_class(self) -> Optional[str]:
        """`module:Class` when the target is a member of a class (placed at the release), else None."""
        target = placed(self.target)
        owner = target.owner_target if target is not None else None
        return None if owner is None else str(owner)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("facts")
        d["where"] = self.where
        return d


@dataclass
class ScanResult:
    """A whole scan: the plugin read, the release compared against, the sites, the files that did not parse."""

    plugin: str
    release: Optional[str]
    files: int
    sites: list[Site] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (file, error): unreadable/unparsable input

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.sites:
            out[s.mechanism] = out.get(s.mechanism, 0) + 1
        return dict(sorted(out.items()))

    def to_json(self) -> dict:
        return {"plugin": self.plugin, "release": self.release, "files": self.files, "counts": self.counts(),
                "sites": [s.to_json() for s in self.sites],
                "errors": [{"file": f, "error": e} for f, e in self.errors]}


__all__ = ["MECHANISMS", "ScanResult", "Site"]
