"""The whole-plugin reach for people (text) and machines (JSON); the values are `uses.py`'s and
`differential.py`'s."""

from __future__ import annotations

import json
from collections import Counter

from vllm_patchkit.tools.reach_plugin.differential import Differential
from vllm_patchkit.tools.reach_plugin.uses import BROKEN, GUARDED, NOT_FOLLOWED, ReleaseReach

NOT_FOLLOWED_SHOWN = 5


def _summary(r: ReleaseReach) -> str:
    c = r.counts()
    total = sum(c.values())
    return (f"vLLM {r.version}: {total} uses of vLLM: {c['ok']} ok, {c[GUARDED]} guarded, {c[BROKEN]} broken, "
            f"{c[NOT_FOLLOWED]} not followed ({r.followed_share():.0%} followed)")


def render_text(label: str, modules: int, base: ReleaseReach, diffs: list[Differential],
                others: list[ReleaseReach]) -> str:
    lines = [f"reach of {label} ({modules} modules)", _summary(base)]
    for u in base.uses:
        if u.state == BROKEN:
            lines.append(f"  BROKEN      {u.where()}  {u.kind} {u.key}: {u.why}")
    for u in base.uses:
        if u.state == GUARDED:
            lines.append(f"  guarded     {u.where()}  {u.kind} {u.key}: {u.why}")
    owners = Counter(u.why.removeprefix("the class of ").removesuffix(" is not known")
                     for u in base.uses if u.state == NOT_FOLLOWED)
    if owners:
        shown = ", ".join(f"{o} ({n})" for o, n in owners.most_common(NOT_FOLLOWED_SHOWN))
        lines.append(f"  not followed (never taken as fine): {sum(owners.values())}, most on: {shown}")
    for d, r in zip(diffs, others):
        lines.append(f"against {_summary(r)}")
        lines.append(f"  relative to {d.old}: {len(d.breaking)} breaking, {len(d.compatible)} compatible, "
                     f"{len(d.already_broken)} already broken on {d.old}")
        for c in d.breaking:
            lines.append(f"  BREAKING    {c.use.where()}  {c.use.kind} {c.use.key}: {c.change}")
        for c in d.compatible:
            lines.append(f"  compatible  {c.use.where()}  {c.use.kind} {c.use.key}: {c.change}")
    return "\n".join(lines) + "\n"


def render_json(label: str, modules: int, base: ReleaseReach, diffs: list[Differential],
                others: list[ReleaseReach]) -> str:
    def one(r: ReleaseReach) -> dict:
        return {"vllm": r.version, "counts": r.counts(), "followed": round(r.followed_share(), 4),
                "uses": [u.to_json() for u in r.uses]}

    return json.dumps({"plugin": label, "modules": modules, "release": one(base),
                       "against": [dict(one(r), differential=d.to_json()) for d, r in zip(diffs, others)]},
                      indent=2) + "\n"


__all__ = ["render_json", "render_text"]
