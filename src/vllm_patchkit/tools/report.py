"""The check's verdict as values: one `PatchResult` per patch, the `Report` over the set, and its
`SharedBreakage`s (each breakage once per target, naming every patch it affects). Rendering is `render.py`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from vllm_patchkit.upstream.findings import Breakage, BreakageKind


class PatchStatus(str, Enum):
    """A patch's verdict on one release (a str: JSON and text show the plain word)."""

    ok = "ok"
    compatible = "compatible"
    stale = "stale"
    broken = "broken"
    not_applicable = "not_applicable"
    unpinned = "unpinned"

    def __str__(self) -> str:
        return self.value


@dataclass
class PatchResult:
    """One patch on the release. `compatible`: only differences this patch survives, against an older
    release's pins (pin carries it forward); `stale`: the same against the release's own manifest (the
    loader compares pins exactly, so the manifest must be re-pinned)."""

    patch: str  # id@version checked (id alone when no version is pinned anywhere)
    status: PatchStatus  # a string is taken and made its member
    breakages: list[Breakage] = field(default_factory=list)
    pins_from: Optional[str] = None  # the release whose pins were compared
    note: str = ""
    retire: Optional[str] = None
    kept: Optional[str] = None  # a probe's evidence that the patch must stay (the release's line that decides)
    file: Optional[str] = None

    def __post_init__(self) -> None:
        self.status = PatchStatus(self.status)

    def as_dict(self) -> dict:
        return {"patch": self.patch, "status": self.status, "pins_from": self.pins_from, "note": self.note,
                "retirable": self.retire, "kept": self.kept, "file": self.file, "breakages": [b.as_dict() for b in self.breakages]}


@dataclass(frozen=True)
class SharedBreakage:
    """One breakage as reported: once per target, with every patch it affects (in check order)."""

    breakage: Breakage  # as found for the first of `patches`
    patches: tuple[str, ...]

    @property
    def kind(self) -> BreakageKind:
        return self.breakage.kind

    @property
    def target(self) -> str:
        return self.breakage.target

    def explain(self) -> str:
        return f"{self.breakage.explain()} — affects {', '.join(self.patches)} ({self.breakage.verdict()})"

    def as_dict(self) -> dict:
        d = self.breakage.as_dict()
        del d["patch"]
        return {**d, "patches": list(self.patches)}


@dataclass
class Report:
    vllm: str
    release: str
    results: list[PatchResult]

    @property
    def breakages(self) -> list[Breakage]:
        return [b for r in self.results for b in r.breakages]

    def findings(self) -> list[SharedBreakage]:
        """The breakages grouped by target (targets in the order first met): two patches pinned alike on
        one target that changed are one finding naming both. Same finding: same kind and explanation."""
        same: dict[tuple, tuple[Breakage, list[str]]] = {}
        for b in self.breakages:
            _, patches = same.setdefault((b.kind, b.explain(), b.breaking, b.compat), (b, []))
            if b.patch not in patches:
                patches.append(b.patch)
        by_target: dict[str, list[SharedBreakage]] = {}
        for b, patches in same.values():
            by_target.setdefault(b.target, []).append(SharedBreakage(b, tuple(patches)))
        return [f for group in by_target.values() for f in group]

    @property
    def failed(self) -> bool:
        """A breaking difference, or a compatible one the release's own manifest has not re-pinned."""
        return any(b.breaking for b in self.breakages) or any(r.status == PatchStatus.stale for r in self.results)

    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in PatchStatus}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        out["retirable"] = sum(1 for r in self.results if r.retire)
        return out
