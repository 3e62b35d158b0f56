"""Findings: what is found about a patch, as values, in one vocabulary from start-up to CI.

A `Finding` is one thing found (a code, why in words, where, what was expected and found) and carries the
`Breakage`s behind it: one incompatibility between a patch's pin and a release each, with its `explain()` words.
Start-up (verify, the kinds, the after-apply checks), records, `check`, `pin` and the pytest items all report
these; rendering them is somebody else's job (griffe's `Breakage` habit).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple, Optional

from msgspec import Struct, field

from vllm_patchkit.declaration.failures import FailureCode
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.return_shape import arity


class ProbeAnswer(NamedTuple):
    """A retirement probe's answer with the evidence read from the release (file:line and what it says).

    `retirable` must rest on positive evidence that the fix is upstream; the absence of the old code is no
    evidence (a probe that cannot find what decides raises: `check` reports it, never "retirable")."""

    retirable: bool
    evidence: str


# -- findings -----------------------------------------------------------------------------------
class BreakageKind(str, Enum):
    target_removed = "target_removed"
    target_moved = "target_moved"
    target_inherited = "target_inherited"
    target_unreadable = "target_unreadable"
    kind_changed = "kind_changed"
    required_parameter_added = "required_parameter_added"
    optional_parameter_added = "optional_parameter_added"
    parameter_removed = "parameter_removed"
    parameter_renamed = "parameter_renamed"
    parameter_moved = "parameter_moved"
    positional_shift = "positional_shift"
    parameter_kind_changed = "parameter_kind_changed"
    parameter_now_required = "parameter_now_required"
    parameter_now_optional = "parameter_now_optional"
    default_changed = "default_changed"
    signature_changed = "signature_changed"
    source_changed = "source_changed"
    return_shape_changed = "return_shape_changed"
    wrappers_changed = "wrappers_changed"
    copy_gone = "copy_gone"
    copy_differs = "copy_differs"
    copy_undeclared = "copy_undeclared"
    misdeclared = "misdeclared"
    unpinned = "unpinned"
    probe_error = "probe_error"
    required_not_applicable = "required_not_applicable"
    value_changed = "value_changed"
    convention_mismatch = "convention_mismatch"
    implementation_unimportable = "implementation_unimportable"
    when_excludes = "when_excludes"
    foreign_replacement = "foreign_replacement"
    unreviewed = "unreviewed"
    reach_missing = "reach_missing"
    name_collision = "name_collision"
    entry_collision = "entry_collision"
    entry_gone = "entry_gone"
    entry_unreadable = "entry_unreadable"

    @property
    def failure_code(self) -> Optional[FailureCode]:
        """The code the loader records for this change (`LOADER_CODES`); None: it records none (below)."""
        return LOADER_CODES[self]


# The loader's word for each change `check` reports, read off how it turns a change into a finding: on the
# patch's target `verify` resolves the place (`target`), judges its kind first (`kind`: a class, a property, a
# value) and its wrapper layers (`conflict`: a layer that is not upstream's; removed or upstream-owned layers are
# not its concern), then `pinned.compare` makes one `fingerprint` finding of every other difference (the kind
# string included). On a place the implementation `uses` or copies (`reimplements`) the same changes are `uses`;
# a declared copy's are `copy`.
LOADER_CODES: dict[BreakageKind, Optional[FailureCode]] = {
    BreakageKind.target_removed: FailureCode.target,
    BreakageKind.target_moved: FailureCode.target,
    BreakageKind.target_inherited: FailureCode.target,
    BreakageKind.target_unreadable: FailureCode.target,
    BreakageKind.kind_changed: FailureCode.fingerprint,  # `kind` when the target became a class or a value
    BreakageKind.required_parameter_added: FailureCode.fingerprint,
    BreakageKind.optional_parameter_added: FailureCode.fingerprint,
    BreakageKind.parameter_removed: FailureCode.fingerprint,
    BreakageKind.parameter_renamed: FailureCode.fingerprint,
    BreakageKind.parameter_moved: FailureCode.fingerprint,
    BreakageKind.positional_shift: FailureCode.fingerprint,
    BreakageKind.parameter_kind_changed: FailureCode.fingerprint,
    BreakageKind.parameter_now_required: FailureCode.fingerprint,
    BreakageKind.parameter_now_optional: FailureCode.fingerprint,
    BreakageKind.default_changed: FailureCode.fingerprint,
    BreakageKind.signature_changed: FailureCode.fingerprint,
    BreakageKind.source_changed: FailureCode.fingerprint,
    BreakageKind.return_shape_changed: FailureCode.fingerprint,  # only when breaking for the patch (pinned.py)
    BreakageKind.value_changed: FailureCode.fingerprint,
    BreakageKind.wrappers_changed: FailureCode.conflict,
    BreakageKind.copy_gone: FailureCode.copy,
    BreakageKind.copy_differs: FailureCode.copy,
    BreakageKind.copy_undeclared: FailureCode.stale_copy,
    BreakageKind.misdeclared: FailureCode.target,  # `kind` for a class named where a function is patched
    BreakageKind.unpinned: FailureCode.unpinned,
    BreakageKind.required_not_applicable: FailureCode.unavailable,  # refused (or skipped: `precondition`)
    BreakageKind.convention_mismatch: FailureCode.convention,
    BreakageKind.implementation_unimportable: FailureCode.implementation,
    BreakageKind.foreign_replacement: FailureCode.conflict,
    BreakageKind.reach_missing: FailureCode.reach,
    BreakageKind.name_collision: FailureCode.collision,
    BreakageKind.entry_collision: FailureCode.collision,
    BreakageKind.entry_gone: FailureCode.fingerprint,
    BreakageKind.entry_unreadable: FailureCode.fingerprint,
    # the loader records no code for these: it stops before any patch has a record (`PatchSetErrors`), or never
    # runs what `check` ran
    BreakageKind.when_excludes: None,
    BreakageKind.unreviewed: None,
    BreakageKind.probe_error: None,
}

#: why the loader records no code for a change `check` reports (the kinds LOADER_CODES maps to None)
NOT_RECORDED: dict[BreakageKind, str] = {
    BreakageKind.when_excludes: "start-up stops before any patch is judged: the manifest's validation raises "
                                "`PatchSetErrors` naming the manifest entry and the patch's `when.vllm`",
    BreakageKind.unreviewed: "start-up stops before any patch is judged: an unreviewed draft raises `PatchSetErrors`",
    BreakageKind.probe_error: "`check` only: the loader never runs a retirement probe",
}


def _q(name: Any) -> str:
    return f"'{name}'"


def _a(kind: Any) -> str:
    return f"{'an' if str(kind)[:1] in 'aeiou' else 'a'} {kind}"


def _explain_shift(b: "Breakage") -> str:
    """`new`: the inserted parameters (adjacent); `old`: the existing ones now one slot further right."""
    what = f"parameter {_q(b.new[0])}" if len(b.new) == 1 else f"parameters {', '.join(map(_q, b.new))}"
    those, them = ("it", "it") if len(b.old) == 1 else ("those", "them")
    return (f"{what} inserted at {b.detail} before {', '.join(map(_q, b.old))}: callers passing {those} "
            f"positionally bind {them} to the wrong parameter")


def _explain_inherited(b: "Breakage") -> str:
    """`target` is `m:C.attr`, `new` the base's definition `m2:Base.attr` it is now inherited from."""
    target = Target.parse(b.target)
    qual, owner = target.qualname, target.owner or ""
    base = Target.parse(b.new).qualname
    said = (f"now inherited from {b.new}, no longer defined on {owner}" if b.old == "defined" else
            f"inherited from {b.new}, not defined on {owner}")  # `old`: the pin had it on the class
    return (f"{said}: a patch on {qual} would add an override "
            f"shadowing {base} for {owner} alone; a patch on {base} alters every class inheriting it")


def _explain_shape(b: "Breakage") -> str:
    """`old`: the pinned `tuple[N]`; `new`: the release's, or None when its source no longer says one."""
    was = f"a tuple of {arity(b.old)} ({b.old})"
    if b.new is None:
        return (f"return shape changed: it returned {was}; its returns no longer read as one tuple literal length, "
                "so what a call returns now is not known")
    return f"return shape changed: it returned {was}, now a tuple of {arity(b.new)} ({b.new})"


def _explain_collision(b: "Breakage") -> str:
    """`target`: the `module:Class.name` the patch adds; `new`: where the release defines that name (the class
    itself or the base the MRO finds it in); `detail`: the release."""
    target = Target.parse(b.target)
    owner, name = target.owner or "", target.attr
    where = "itself" if b.new == b.target else f"through {b.new}"
    return (f"{b.patch} adds {name} to {owner}, and vLLM {b.detail} defines {owner}.{name} {where}: the name the "
            f"plugin adds would replace vLLM's own, which vLLM's code then no longer reaches (a collision)")


def _explain_reach(b: "Breakage") -> str:
    """`target`: `module:Class.name` (an import: `module:name`); `old`: what the implementation does with it (import,
    attribute, method); `detail`: the implementation's file:line; `new`: the release."""
    target = Target.parse(b.target)
    if b.old == "import":
        module, name = target
        return f"{b.patch} imports {name} from {module} ({b.detail}); vLLM {b.new} has no {name} in {module}"
    owner, name = target.owner or "", target.attr
    if b.old == "provide":
        reader, _, cls = str(b.detail).rpartition("; ")
        return (f"{b.patch} swaps {cls} in for {owner}; vLLM {b.new}'s {reader} reads self.{name} on its objects, "
                f"which {Target.parse(cls).qualname} does not set: AttributeError when vLLM calls it")
    verb, what = ("calls", "method") if b.old == "method" else ("reads", "attribute")
    return f"{b.patch} {verb} {owner}.{name} ({b.detail}); vLLM {b.new} defines no such {what} on {owner}"


_EXPLAIN = {
    BreakageKind.target_removed: lambda b: f"target not found: {b.detail}",
    BreakageKind.target_moved: lambda b: f"target moved: now defined at {b.new} ({b.detail})",
    BreakageKind.target_inherited: _explain_inherited,
    BreakageKind.target_unreadable: lambda b: f"target cannot be read: {b.detail}",
    BreakageKind.kind_changed: lambda b: f"changed from {_a(b.old)} to {_a(b.new)}",
    BreakageKind.required_parameter_added:
        lambda b: f"required parameter {_q(b.parameter)} added ({b.new}): a call that does not pass it raises TypeError",
    BreakageKind.optional_parameter_added: lambda b: f"parameter {_q(b.parameter)} added ({b.new})",
    BreakageKind.parameter_removed:
        lambda b: f"parameter {_q(b.parameter)} removed (was {b.old}): a call that passes it raises TypeError",
    BreakageKind.parameter_renamed:
        lambda b: f"parameter {_q(b.old)} renamed to {_q(b.new)} ({b.detail}): keyword calls using {_q(b.old)} break",
    BreakageKind.parameter_moved:
        lambda b: f"parameter {_q(b.parameter)} moved from position {b.old} to {b.new}: positional calls bind it to another argument",
    BreakageKind.positional_shift: _explain_shift,
    BreakageKind.parameter_kind_changed: lambda b: f"parameter {_q(b.parameter)} changed kind: {b.old} -> {b.new}",
    BreakageKind.parameter_now_required:
        lambda b: f"parameter {_q(b.parameter)} is now required (its default {b.old} was removed)",
    BreakageKind.parameter_now_optional: lambda b: f"parameter {_q(b.parameter)} now has a default ({b.new})",
    BreakageKind.default_changed: lambda b: f"default of {_q(b.parameter)} changed: {b.old} -> {b.new}",
    BreakageKind.signature_changed: lambda b: f"signature changed: {b.old} -> {b.new}",
    BreakageKind.source_changed:
        lambda b: f"source changed ({b.old} -> {b.new}): the code the patch copies from upstream must be re-synced",
    BreakageKind.return_shape_changed: lambda b: _explain_shape(b),
    BreakageKind.wrappers_changed: lambda b: f"decorator layers changed: {b.old} -> {b.new}",
    BreakageKind.copy_gone: lambda b: f"copy location gone: {b.detail}",
    BreakageKind.copy_differs:
        lambda b: f"copy location no longer holds the target: it holds {b.new}, the target is {b.old}",
    BreakageKind.copy_undeclared:
        lambda b: f"{b.new} holds the target by value and is not declared in `copies`: calls through it bypass "
                  "the patch (the loader reports it as stale_copy)",
    BreakageKind.misdeclared: lambda b: f"declaration does not fit the place: {b.detail}",
    BreakageKind.unpinned: lambda b: f"no pin: {b.detail}",
    BreakageKind.probe_error: lambda b: f"retirement probe failed: {b.detail}",
    BreakageKind.convention_mismatch: lambda b: f"the implementation does not fit the call convention: {b.detail}",
    BreakageKind.value_changed:
        lambda b: f"value changed since it was pinned (digest {b.old} -> {b.new or 'none: no longer a simple literal'})",
    BreakageKind.required_not_applicable: lambda b: _explain_required_na(b),
    BreakageKind.implementation_unimportable:
        lambda b: f"the implementation cannot be imported: {b.detail}; the loader refuses the patch at start-up "
                  "(`implementation`)",
    BreakageKind.reach_missing: lambda b: _explain_reach(b),
    BreakageKind.name_collision: lambda b: _explain_collision(b),
    BreakageKind.entry_collision:
        lambda b: (f"{b.patch} registers {b.new!r} in {b.target}, and vLLM {b.detail} registers that key itself: the "
                   "plugin's entry would replace vLLM's own, which vLLM then no longer reaches (a collision)"),
    BreakageKind.entry_gone:
        lambda b: (f"{b.patch} replaces vLLM's entry {b.new!r} of {b.target}, and vLLM {b.detail} no longer registers "
                   "that key: what the plugin's entry stood in for is gone, and whether vLLM still looks it up is "
                   "not known" if b.old == "pinned" else
                   f"{b.patch} replaces vLLM's entry {b.new!r} of {b.target}, but vLLM {b.detail} does not register "
                   "that key: if the plugin adds it, declare `adds: true`"),
    BreakageKind.entry_unreadable:
        lambda b: (f"whether vLLM {b.detail} registers {b.new!r} in {b.target} cannot be read ({b.old}): nothing "
                   "can be judged; check it where the release is installed (`check --live`)"),
    BreakageKind.when_excludes: lambda b: f"manifest and patch contradict each other: {b.detail}",
    BreakageKind.unreviewed: lambda b: f"not reviewed: {b.detail}",
    BreakageKind.foreign_replacement:
        lambda b: f"replaced at run time by code outside vLLM: {b.new}; another plugin's object stands there, so "
                  "the pin cannot be compared and the loader refuses the patch (`conflict`); a new pin would read "
                  "the same vLLM source: remove that plugin or keep it from loading (`VLLM_PLUGINS`), or agree "
                  "with its authors on one change",
}


def _explain_required_na(b: "Breakage") -> str:
    """What the loader really does with a needed required patch the release's manifest marks not applicable
    (`new`): `refused` when a version's `when.vllm` admits the release (the manifest offers it no entry),
    `skipped` when none does (the loader judges it not needed here, a precondition, before asking the
    manifest)."""
    head = f"required patch {b.patch} is marked not applicable on this release ({b.detail}): "
    fix = ("add a patch version that fits, or record a reviewer's decision with "
           "`vllm-patchkit pin --not-applicable ID='reason'`")
    if b.new == "skipped":
        return (head + "and no version's when.vllm admits the release, so the loader judges it not needed here and "
                "skips it (`skipped` / `precondition`): a model that needs it starts WITHOUT it, with no warning and "
                f"status exit 0; {fix.replace('a patch version that fits', 'a patch version whose when.vllm admits the release and that fits')}")
    return (head + "a model that needs it is refused at start-up (`refused` / `unavailable`, unless "
            f"VLLM_PATCHKIT_ALLOW_UNPATCHED names it); {fix}")


class Breakage(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """One incompatibility between a patch's pin and a release."""

    kind: BreakageKind
    patch: str  # id@version
    target: str  # module:Qualname (the target or a copy)
    parameter: Optional[str] = None
    old: Any = None
    new: Any = None
    detail: Optional[str] = None
    # judged for `patch` by compat.judge: does this difference break this patch, and why (None: not judged)
    breaking: bool = True
    compat: Optional[str] = None
    # source_changed: the copied body's unified diff between the pinned release and this one (sourcediff.py)
    diff: Optional[str] = None

    def explain(self) -> str:
        return f"{self.target}: {_EXPLAIN[self.kind](self)}"

    def verdict(self) -> str:
        """`breaking` / `compatible`, with the reason when judged."""
        word = "breaking" if self.breaking else "compatible"
        return f"{word}: {self.compat}" if self.compat else word

    def as_dict(self) -> dict:
        d = {"kind": self.kind.value, "patch": self.patch, "target": self.target, "parameter": self.parameter,
             "old": self.old, "new": self.new, "explain": self.explain(), "breaking": self.breaking,
             "compat": self.compat}
        if self.diff is not None:  # source_changed only: the copied body's diff
            d["diff"] = self.diff
        return d


class Finding(Struct):
    """One thing found about a patch: why it cannot apply (verify), a call convention it breaks, a copy that
    bypasses it, a place where it no longer stands. Goes into the patch's record as `as_record()`."""

    code: FailureCode  # a string is taken and made its member; any other string raises
    reason: str
    expected: Any = None
    found: Any = None
    breakages: list = field(default_factory=list)  # the `Breakage`s behind it, as `check` reports them
    where: Optional[str] = None  # the place (module:Qualname) or the parameter it is about

    def __post_init__(self) -> None:
        try:
            self.code = FailureCode(self.code)
        except ValueError:
            raise ValueError(f"Finding code {self.code!r} is not a FailureCode member: a finding's code must be one "
                             "of vllm_patchkit.declaration.failures.FailureCode (add its row there)") from None

    def __str__(self) -> str:
        return self.reason

    def as_record(self, **extra: Any) -> dict:
        """The finding as a record carries it (JSON): code, where, reason, and what else the finding names."""
        d = {"code": self.code}
        if self.where is not None:
            d["where"] = self.where
        d.update(extra)
        d["reason"] = self.reason
        return d
