"""The failure codes: every code the loader writes into a patch's record, one row each with its meaning, its remedy
and whether another vLLM release could cure it.

One vocabulary for the loader (a record's `code`, a finding's `code`), `check` (each `BreakageKind` names the code
the loader reports for its change: `upstream/findings.py`), the remedies a refusal offers (`errors.remedies`) and
the docs (docs/failure-codes.md, generated from these rows). A str Enum: records and JSON keep the plain strings,
and a record read back (plain strings) compares equal to the members. It lives in the lowest layer because
`errors.py` and every layer above use it."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class FailureCode(str, Enum):
    """A code the loader can put in a record (its `code`, or a finding's)."""

    # -- a record's `code`: why the patch is not applied (skipped, refused, failed, not imported) ---------------
    process = "process"
    precondition = "precondition"
    precondition_unknown = "precondition_unknown"
    requires = "requires"
    unavailable = "unavailable"
    unpatched_allowed = "unpatched_allowed"
    not_selected = "not_selected"
    not_imported = "not_imported"
    refused = "refused"
    target = "target"
    unpinned = "unpinned"
    fingerprint = "fingerprint"
    conflict = "conflict"
    copy = "copy"
    kind = "kind"
    uses = "uses"
    value_from = "value_from"
    implementation = "implementation"
    convention = "convention"
    reach = "reach"
    collision = "collision"
    override = "override"
    undeclared_override = "undeclared_override"
    config_field = "config_field"
    apply = "apply"
    replaced_after_apply = "replaced_after_apply"
    hosting = "hosting"
    # -- an entry of a record's `findings` ------------------------------------------------------------------
    breakage = "breakage"
    stale_copy = "stale_copy"
    shadowed = "shadowed"
    not_built = "not_built"
    # -- a call-convention problem: the loader joins them into one `convention` (or `implementation`) finding;
    # `check` reports each as `convention_mismatch` (`implementation_unimportable`) with the code in `new` --------
    shape = "shape"
    unknown_param = "unknown_param"
    implementation_missing = "implementation_missing"
    constructed = "constructed"
    no_varargs = "no_varargs"
    no_varkw = "no_varkw"
    kwonly_not_accepted = "kwonly_not_accepted"
    made_required = "made_required"
    renamed = "renamed"
    dropped = "dropped"
    reordered = "reordered"
    keyword_only = "keyword_only"
    not_positional = "not_positional"
    not_by_keyword = "not_by_keyword"
    extra_required = "extra_required"
    extra_positional = "extra_positional"

    def __str__(self) -> str:  # f-strings and messages show the plain code, as they did with strings
        return self.value


#: where the loader writes a code: the record's `code` (with the states it comes with), `findings`, or inside
#: a `convention` finding (a problem of the implementation's call convention)
SKIPPED, REFUSED, FAILED, NOT_IMPORTED = "skipped", "refused", "failed", "not_imported"
FINDINGS, CONVENTION = "findings", "convention problem"


class FailureRow(NamedTuple):
    code: FailureCode
    recorded: tuple[str, ...]  # where the loader writes it (above)
    meaning: str
    #: what fixes it, offered by a refusal's message (the installed release is `{v}`, the patch id `{pid}`);
    #: "": nothing beyond the override `errors.allow_remedy` names
    remedy: str = ""
    #: another vLLM release could cure it (the target or its pin): the message then names the releases that pin
    #: the patch; the rest are the plugin's or someone else's
    release_bound: bool = False


C = FailureCode
ROWS: tuple[FailureRow, ...] = (
    FailureRow(C.process, (SKIPPED,), "the patch belongs to other processes"),
    FailureRow(C.precondition, (SKIPPED,), "a `when` field does not hold here: the patch is not needed"),
    FailureRow(C.precondition_unknown, (SKIPPED, FAILED), "a fact one of its preconditions reads cannot be read on "
               "this vLLM (an optional patch is skipped with a warning, a required one fails)",
               "the framework cannot read this precondition's fact on vLLM {v} (upstream removed or "
               "renamed what it reads): teach its row in `declaration/precondition_table.py` to read it there (report "
               "it), or serve a release whose facts it reads", True),
    FailureRow(C.requires, (SKIPPED, FAILED), "a patch it requires is not applied",
               "make the patch it requires apply first (its own row says why it did not)"),
    FailureRow(C.unavailable, (SKIPPED, REFUSED), "needed here, but this release's manifest offers no entry for it "
               "(`found`: not_applicable, not_listed or no_manifest)",
               "port it: `vllm-patchkit pin --vllm {v}` (a new patch version if the change is breaking), "
               "review, commit", True),
    FailureRow(C.unpatched_allowed, (SKIPPED,), "a needed required patch that cannot apply, served without it because "
               "VLLM_PATCHKIT_ALLOW_UNPATCHED names it (`detail.failure`: the code it failed with)"),
    FailureRow(C.not_selected, (SKIPPED,), "kind subclass: with the config field at its value vLLM builds another "
               "class than the declared base"),
    FailureRow(C.not_imported, (NOT_IMPORTED,), "needed and verifiable, but its target module was not imported in "
               "this process: applied when it is"),
    FailureRow(C.refused, (REFUSED,), "a `refuse` patch's condition holds: start-up stops with its message"),
    FailureRow(C.target, (FAILED,), "the target (or the class it sets on) is gone, moved, inherited rather than "
               "defined, or held by value from elsewhere",
               "upstream moved or removed it: `vllm-patchkit check --vllm {v}` says where it went; write a patch "
               "version that fits vLLM {v} and pin it", True),
    FailureRow(C.unpinned, (FAILED,), "the manifest has no fingerprint for a place the patch needs",
               "the manifest for vLLM {v} has no pin for it: `vllm-patchkit pin --vllm {v}`, review, commit", True),
    FailureRow(C.fingerprint, (FAILED,), "the target's kind, signature, source or value differs from its pin, "
               "or its return shape does in a way the patch depends on",
               "the vLLM installed here differs from the one its manifest pinned: `vllm-patchkit check --live` "
               "shows the difference as the loader sees it; if this vLLM is the one to serve, adapt the patch "
               "(a new version if the change is breaking) and re-pin it (`vllm-patchkit pin --vllm {v}`)", True),
    FailureRow(C.conflict, (FAILED,), "someone else's code stands at the target: a foreign wrapper layer, a "
               "replacement, another value in the config field",
               "someone else's code stands at the target (found above): remove that plugin or keep it from "
               "loading (`VLLM_PLUGINS` lists the general plugins vLLM loads), or agree with its authors on one "
               "change; another vLLM release or a new pin does not help"),
    FailureRow(C.copy, (FAILED, FINDINGS), "a declared copy is gone or holds another object than the target",
               "upstream no longer holds it by value there: `vllm-patchkit check --vllm {v}` names the place; remove it "
               "from `copies` in a new patch version and pin it", True),
    FailureRow(C.kind, (FAILED,), "the target is not what the patch's kind can change (a class, a property, a "
               "value, objects without a __dict__)",
               "the target is not a function here: declare the kind that fits it (a new patch version) and pin it",
               True),
    FailureRow(C.uses, (FAILED,), "an upstream callable the implementation uses or copies is gone or changed",
               "an upstream callable the implementation uses or copies changed: `vllm-patchkit check --vllm {v}` shows "
               "the change; adapt the implementation in a new patch version and pin it", True),
    FailureRow(C.value_from, (FAILED,), "the `value_from` object cannot be imported",
               "fix the patch's `value_from` object (it must import)"),
    FailureRow(C.implementation, (FAILED, CONVENTION), "the implementation cannot be imported or is not callable "
               "(a subclass: not a subclass of the target)",
               "fix the patch's implementation module (it must import and define a callable); "
               "`vllm-patchkit check` reports the same"),
    FailureRow(C.convention, (FAILED,), "the implementation does not take the calls vLLM makes (its problems: the "
               "convention codes below)",
               "fix the implementation's signature to take the calls vLLM makes (the reason names the "
               "parameter); `vllm-patchkit check` reports the same"),
    FailureRow(C.reach, (FAILED,), "a name the implementation reads, calls or imports in vLLM is not there",
               "vLLM {v} no longer defines a name the implementation reads, calls or imports (found above): "
               "`vllm-patchkit check --vllm {v}` names the implementation's line; adapt the implementation in a new "
               "patch version and pin it", True),
    FailureRow(C.collision, (FAILED,), "vLLM defines the name a `set` with `adds` adds, or registers the key a `register` with `adds` sets",
               "vLLM {v} now defines the name the patch adds (found above): rename the added name in a new patch "
               "version (and every caller of it in the plugin), or drop it if vLLM's own now does the job; pin it"),
    FailureRow(C.override, (FAILED,), "kind subclass: a method listed in `overrides` is not defined by the "
               "implementation",
               "define the override the patch declares, or remove it from `overrides` (a new patch version)"),
    FailureRow(C.undeclared_override, (FAILED,), "kind subclass: the implementation overrides a base method another "
               "patch pins without listing it in `overrides`",
               "list the override in `overrides` (a new patch version) and pin it"),
    FailureRow(C.config_field, (FAILED,), "kind subclass: the config field does not exist, or vLLM cannot resolve "
               "its value", "fix `config_field`, or the value someone else put in that field"),
    FailureRow(C.apply, (FAILED,), "installing it raised", "installing it raised: report a bug with this message"),
    FailureRow(C.replaced_after_apply, (FAILED,), "after it applied, something replaced the patched object",
               "a plugin loaded after vllm-patchkit replaced the patched object (found above): remove "
               "that plugin or keep it from loading (`VLLM_PLUGINS`), or agree with its authors on one "
               "change"),
    FailureRow(C.hosting, (FAILED,), "this process runs another role's code too, and that role's hook did not "
               "apply: its patches would not be judged here"),
    FailureRow(C.breakage, (FINDINGS,), "one difference behind a failed finding, as `check` reports it (its `kind` "
               "is a BreakageKind)"),
    FailureRow(C.stale_copy, (FINDINGS,), "a module holds the original by value under a name not declared in "
               "`copies`: calls through it bypass the patch"),
    FailureRow(C.shadowed, (FINDINGS,), "a class this process uses overrides the patched method without calling "
               "it: the patch can never run"),
    FailureRow(C.not_built, (FINDINGS,), "kind subclass: after the engine stepped, vLLM had built no object of the "
               "subclass"),
    FailureRow(C.shape, (CONVENTION,), "a wrap implementation cannot be called as "
               "impl(wrapped, instance, args, kwargs[, ctx])"),
    FailureRow(C.unknown_param, (CONVENTION,), "a parameter declared in `params` is not in the target's signature"),
    FailureRow(C.implementation_missing, (CONVENTION,), "`check`: the implementation's module is not on this "
               "Python's path (the loader: `implementation`)"),
    FailureRow(C.constructed, (CONVENTION,), "a subclass's __init__ rejects a construction vLLM makes"),
    FailureRow(C.no_varargs, (CONVENTION,), "no *args where the target has them"),
    FailureRow(C.no_varkw, (CONVENTION,), "no **kwargs where the target has them"),
    FailureRow(C.kwonly_not_accepted, (CONVENTION,), "a keyword-only parameter of the target is not accepted"),
    FailureRow(C.made_required, (CONVENTION,), "a parameter the target defaults is required"),
    FailureRow(C.renamed, (CONVENTION,), "a parameter of the target is renamed: keyword calls break"),
    FailureRow(C.dropped, (CONVENTION,), "a parameter of the target is not accepted"),
    FailureRow(C.reordered, (CONVENTION,), "a parameter sits at another position than the target's: positional "
               "calls bind the wrong argument"),
    FailureRow(C.keyword_only, (CONVENTION,), "a positional parameter of the target is keyword-only"),
    FailureRow(C.not_positional, (CONVENTION,), "a positional parameter of the target is not accepted positionally"),
    FailureRow(C.not_by_keyword, (CONVENTION,), "a parameter of the target is not accepted by keyword"),
    FailureRow(C.extra_required, (CONVENTION,), "a required parameter the target does not have"),
    FailureRow(C.extra_positional, (CONVENTION,), "a parameter at a position where the target collects extra "
               "positional arguments in *args"),
)
del C

#: code -> its row (a plain string finds its member's row too: a str Enum hashes and compares as its value)
BY_CODE: dict[FailureCode, FailureRow] = {r.code: r for r in ROWS}


def row(code: str) -> "FailureRow | None":
    """The row of `code` (a member or its string), None for a string that is no code."""
    return BY_CODE.get(code)


__all__ = ["BY_CODE", "FailureCode", "FailureRow", "ROWS", "row"]
