"""Errors that name the file, the field or the patch, and what was expected."""

from __future__ import annotations

from vllm_patchkit.declaration.failures import row
from vllm_patchkit.declaration.names import PatchKey


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
        if any(PatchKey.parse(e.patch).id == pid for e in m.patches):
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


def remedies(code: str, pid: str, installed: str, manifests: dict) -> str:
    """The remedies a message offers for a needed required patch that failed with `code` on `installed`."""
    parts, lead = [], ""
    failure = row(code)  # what fixes each code, and whether another release could: declaration/failures.py
    if failure is not None and failure.release_bound:
        other, lead = _elsewhere(pid, installed, manifests)
        if other:
            parts.append(other)
    if failure is not None and failure.remedy:
        parts.append(failure.remedy.format(v=installed, pid=pid))
    allow = allow_remedy(pid)
    if not parts:
        return f"{lead}Remedy: {allow[len('or, '):]}."
    return f"{lead}Remedies: {'; or '.join(parts)}; {allow}."
