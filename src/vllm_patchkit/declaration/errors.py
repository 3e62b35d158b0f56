"""Errors that name the file, the field or the patch, and what was expected."""

from __future__ import annotations


class PatchkitError(Exception):
    """Base class of every error this package raises on purpose."""


class DeclarationError(PatchkitError, ValueError):
    """A patch file or manifest is malformed; nothing has been applied."""

    def __init__(self, file: str, field: str, problem: str):
        self.file = file
        self.field = field
        self.problem = problem
        super().__init__(f"{file}: {field}: {problem}")


class PatchSetErrors(PatchkitError, ValueError):
    """Several declaration errors, reported together so one run shows them all."""

    def __init__(self, errors: list[DeclarationError]):
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"{len(errors)} problem(s) in the patch set:\n{lines}")


class RequiredPatchFailed(PatchkitError, RuntimeError):
    """A required patch did not apply; start-up must stop."""

    def __init__(self, record):
        self.record = record
        super().__init__(
            f"vllm-patchkit: required patch {record.patch} {record.state}"
            f" (target {record.target or '-'}): {record.reason}; expected {record.expected!r}, found {record.found!r}."
            " vLLM start-up stopped; `vllm-patchkit status` shows every patch of this process."
            + (f" {record.detail['remedy']}" if isinstance(getattr(record, "detail", None), dict)
               and record.detail.get("remedy") else "")
        )


class Refusal(PatchkitError, ValueError):
    """A `refuse` patch's condition holds: this configuration must not start."""


class RequiredPatchUnavailable(PatchkitError, RuntimeError):
    """A required patch is needed by this model but this release offers no way to apply it."""

    def __init__(self, record, message: str):
        self.record = record
        super().__init__(message)


# -- remedies: what the message of a needed required patch that cannot apply offers ----------------
# Every remedy offered here is one the code honours (tests/reliability/test_remedies.py does what each
# message says): `VLLM_PATCHKIT_ALLOW_UNPATCHED` skips the patch, loudly, for every failure class below
# (loader.py `_allowed`); "a release it is pinned for" names only releases other than the installed one.
ALLOW_ENV = "VLLM_PATCHKIT_ALLOW_UNPATCHED"


def _same_release(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return a == b
    return va == vb or Version(va.base_version) == Version(vb.base_version)


def other_releases(pid: str, installed: str, manifests: dict) -> list[str]:
    """Releases other than the installed one whose manifest lists some version of the patch, oldest first.
    `manifests`: release -> a `Manifest` or a `manifest.Loaded`."""
    from packaging.version import Version

    out = []
    for v, m in manifests.items():
        m = getattr(m, "manifest", m)
        if _same_release(v, installed):
            continue
        if any(e.patch.split("@")[0] == pid for e in m.patches):
            out.append(v)
    return sorted(out, key=Version)


def _elsewhere(pid: str, installed: str, manifests: dict) -> tuple[str, str]:
    """(a remedy naming the other releases that pin the patch, or "", and a sentence when none does)."""
    others = other_releases(pid, installed, manifests)
    if others:
        return f"use a vLLM release it is pinned for ({', '.join(others)})", ""
    return "", f"No vLLM release other than {installed} pins it. "


def allow_remedy(pid: str) -> str:
    return (f"or, at your own risk, set {ALLOW_ENV}={pid} (or `all`) to serve without it: the patch is then "
            "skipped, logged as a warning and listed under `warnings` by `vllm-patchkit status` (a warning never changes its exit code)")


# failure code -> what fixes it (the installed release is `{v}`, the patch id `{pid}`)
_FIX = {
    "unavailable": "port it: `vllm-patchkit pin --vllm {v}` (a new patch version if the change is breaking), "
                   "review, commit",
    "target": "upstream moved or removed it: `vllm-patchkit check --vllm {v}` says where it went; write a patch "
              "version that fits vLLM {v} and pin it",
    "copy": "upstream no longer holds it by value there: `vllm-patchkit check --vllm {v}` names the place; remove it "
            "from `copies` in a new patch version and pin it",
    "uses": "an upstream callable the implementation uses or copies changed: `vllm-patchkit check --vllm {v}` shows "
            "the change; adapt the implementation in a new patch version and pin it",
    "reach": "vLLM {v} no longer defines a name the implementation reads, calls or imports (found above): "
             "`vllm-patchkit check --vllm {v}` names the implementation's line; adapt the implementation in a new "
             "patch version and pin it",
    "collision": "vLLM {v} now defines the name the patch adds (found above): rename the added name in a new patch "
                 "version (and every caller of it in the plugin), or drop it if vLLM's own now does the job; pin it",
    "kind": "the target is not a function here: declare the kind that fits it (a new patch version) and pin it",
    "unpinned": "the manifest for vLLM {v} has no pin for it: `vllm-patchkit pin --vllm {v}`, review, commit",
    "fingerprint": "the vLLM installed here differs from the one its manifest pinned: `vllm-patchkit check --live` "
                   "shows the difference as the loader sees it; if this vLLM is the one to serve, adapt the patch "
                   "(a new version if the change is breaking) and re-pin it (`vllm-patchkit pin --vllm {v}`)",
    "conflict": "someone else's code stands at the target (found above): remove that plugin or keep it from "
                "loading (`VLLM_PLUGINS` lists the general plugins vLLM loads), or agree with its authors on one "
                "change; another vLLM release or a new pin does not help",
    "replaced_after_apply": "a plugin loaded after vllm-patchkit replaced the patched object (found above): remove "
                            "that plugin or keep it from loading (`VLLM_PLUGINS`), or agree with its authors on one "
                            "change",
    "implementation": "fix the patch's implementation module (it must import and define a callable); "
                      "`vllm-patchkit check` reports the same",
    "convention": "fix the implementation's signature to take the calls vLLM makes (the reason names the "
                  "parameter); `vllm-patchkit check` reports the same",
    "value_from": "fix the patch's `value_from` object (it must import)",
    "override": "define the override the patch declares, or remove it from `overrides` (a new patch version)",
    "undeclared_override": "list the override in `overrides` (a new patch version) and pin it",
    "config_field": "fix `config_field`, or the value someone else put in that field",
    "precondition_unknown": "the framework cannot read this precondition's fact on vLLM {v} (upstream removed or "
                            "renamed what it reads): teach `declaration/preconditions.py` to read it there (report "
                            "it), or serve a release whose facts it reads",
    "requires": "make the patch it requires apply first (its own row says why it did not)",
    "apply": "installing it raised: report a bug with this message",
}

# failures another vLLM release could cure (the target or its pin); the rest are the plugin's or someone else's
_RELEASE_BOUND = frozenset({"precondition_unknown", "unavailable", "target", "copy", "uses", "reach", "kind", "unpinned",
                            "fingerprint"})


def remedies(code: str, pid: str, installed: str, manifests: dict) -> str:
    """The remedies a message offers for a needed required patch that failed with `code` on `installed`."""
    parts, lead = [], ""
    if code in _RELEASE_BOUND:
        other, lead = _elsewhere(pid, installed, manifests)
        if other:
            parts.append(other)
    fix = _FIX.get(code)
    if fix:
        parts.append(fix.format(v=installed, pid=pid))
    allow = allow_remedy(pid)
    if not parts:
        return f"{lead}Remedy: {allow[len('or, '):]}."
    return f"{lead}Remedies: {'; or '.join(parts)}; {allow}."
