"""Drafts nobody has reviewed: a patch `scan --write` drafted carries `draft: true`, and its fields the scan
could not know say `TODO`. Either would let a guess pass as a decision (a draft `check`s `ok` while the plugin's
real logic is not in it), so the loader refuses the marker and `pin` / `check` refuse both, naming the file and
the field, until a person has reviewed the patch."""

from __future__ import annotations

from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.patchsets import PatchSet

#: the fields a draft fills with a placeholder the patch cannot work with
PLACEHOLDER_FIELDS = ("target", "implementation", "value_from", "why")
DRAFT = ("drafted by `vllm-patchkit scan --write` and not reviewed: review the patch (every TODO, `required`, "
         "`processes`, `when`; docs/adopting.md, \"Review the drafts\") and delete the line `draft: true`")


def drafts(patch_set: PatchSet) -> list[DeclarationError]:
    """One error per patch that still carries the draft marker."""
    return [DeclarationError(patch_set.files.get(key, key), "draft", DRAFT)
            for key, p in sorted(patch_set.patches.items()) if p.draft]


def placeholders(patch_set: PatchSet) -> list[DeclarationError]:
    """One error per field that still holds a `TODO…` placeholder."""
    out = []
    for key, p in sorted(patch_set.patches.items()):
        for name in PLACEHOLDER_FIELDS:
            value = getattr(p, name, None)
            if isinstance(value, str) and value.lstrip().upper().startswith("TODO"):
                out.append(DeclarationError(patch_set.files.get(key, key), name,
                                            f"placeholder {value[:60]!r}{'…' if len(value) > 60 else ''}: "
                                            f"write the real {name} of {p.key}"))
    return out


def refuse_drafts(patch_set: PatchSet) -> None:
    """The loader's rule: a set with an unreviewed draft is not loaded (nothing is applied)."""
    errors = drafts(patch_set)
    if errors:
        raise PatchSetErrors(errors)


__all__ = ["DRAFT", "PLACEHOLDER_FIELDS", "drafts", "placeholders", "refuse_drafts"]
