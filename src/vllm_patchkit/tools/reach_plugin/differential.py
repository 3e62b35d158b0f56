"""What release B changes, relative to release A, under a plugin's uses of vLLM: each use judged on both, the
pairs compared.

- **breaking**: a use that works on A and not on B (a name gone, a call or an override that no longer fits, an
  abstract method the base gained, a base method an override no longer overrides), with the upstream change
  (the signature diff, `sigdiff.diff_signatures`; for a name gone, where it is now when found by its identity,
  `moved_identity.confirm_moves`, never by its name alone);
- **compatible**: a use that works on both while what B has there changed (a signature that still takes the
  call, an import now served by its fallback);
- a use already broken on A is not B's change: listed apart (`already_broken`).
A use read on one release only (a type inferred on A and not on B) is not compared; a use on B alone that is
broken (a new abstract method) is breaking.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from vllm_patchkit.tools.reach_plugin.uses import BROKEN, GUARDED, OK, ReleaseReach, Use, by_ident
from vllm_patchkit.upstream.sigdiff import diff_signatures

_SIGNED = ("call", "override")


@dataclass(frozen=True)
class Change:
    use: Use  # as judged on B
    before: Optional[Use]  # as judged on A
    change: str  # what upstream changed, in words

    def to_json(self) -> dict:
        return {"use": self.use.to_json(), "before": self.before.to_json() if self.before else None,
                "change": self.change}


@dataclass
class Differential:
    old: str
    new: str
    breaking: list[Change] = field(default_factory=list)
    compatible: list[Change] = field(default_factory=list)
    already_broken: list[Use] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"from": self.old, "to": self.new, "breaking": [c.to_json() for c in self.breaking],
                "compatible": [c.to_json() for c in self.compatible],
                "already_broken": [u.to_json() for u in self.already_broken]}


def _signature_change(old: str, new: str) -> str:
    found = diff_signatures("", "", old, new)
    return "; ".join(b.explain().partition(": ")[2] for b in found) or f"{old} -> {new}"


def _change(a: Optional[Use], b: Use, moved: Optional[str]) -> str:
    if b.kind == "override" and b.upstream == "absent":
        return (f"vLLM no longer defines the base method {b.key}: the override {b.subject} is never called by vLLM "
                f"(was {a.key if a else '?'})")
    if a is not None and b.kind in _SIGNED and a.upstream and b.upstream and a.upstream != b.upstream \
            and b.upstream != "absent":
        text = f"{b.key}: {_signature_change(a.upstream, b.upstream)}"
    elif a is None:
        text = b.why
    else:
        text = b.why or f"{b.key}: {a.upstream or a.state} -> {b.upstream or b.state}"
    return text + (f"; now defined at {moved} (same function, by identity)" if moved else "")


def compare(a: ReleaseReach, b: ReleaseReach, moves=None) -> Differential:
    """B's changes under the plugin's uses, relative to A. `moves(key) -> Optional[str]`: where a name gone on B
    is now, by identity (`moved_identity`), or None."""
    out = Differential(a.version, b.version)
    before = by_ident(a)
    for u in b.uses:
        old = before.get(u.ident)
        if old is not None and old.state == BROKEN and u.state == BROKEN:
            out.already_broken.append(u)
            continue
        if u.kind == "override" and u.upstream == "absent":
            if old is not None and old.upstream != "absent":
                out.breaking.append(Change(u, old, _change(old, u, None)))
            continue
        if u.state == BROKEN and (old is None or old.state in (OK, GUARDED)):
            if old is None and u.kind not in ("abstract", "import"):
                continue  # read on B only: not compared
            moved = moves(u.key) if moves is not None and u.kind == "import" else None
            out.breaking.append(Change(u, old, _change(old, u, moved)))
        elif old is not None and old.state == OK and u.state == GUARDED:
            out.compatible.append(Change(u, old, f"{u.why} (the plugin's guard takes it)"))
        elif (old is not None and old.state == OK and u.state == OK and old.upstream != u.upstream):
            out.compatible.append(Change(u, old, _change(old, u, None)))
    return out


def identity_moves(release_a, release_b):
    """`moves` for `compare`: a name's new home on B, when `moved_identity` confirms it is the same function."""
    from vllm_patchkit.tools.moved_identity import confirm_moves
    from vllm_patchkit.upstream.missing import Missing

    def moves(key: str) -> Optional[str]:
        pin = release_a.lookup(key)
        if isinstance(pin, Missing):
            return None
        gone = release_b.lookup(key)
        if not isinstance(gone, Missing):
            return None
        kept = confirm_moves(release_b, release_a, key, pin, gone)
        return ", ".join(kept.moved_to) or None

    return moves


__all__ = ["Change", "Differential", "compare", "identity_moves"]
