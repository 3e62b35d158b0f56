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
