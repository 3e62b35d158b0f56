"""The part of an upstream body a patch copies, when it copies a part: the statements its `copied_part` names.

A plugin often re-implements one branch of a long vLLM function (the path its platform takes) and calls the rest,
or copies a prefix; upstream then changes another branch, and a digest of the whole body says "re-sync" when
nothing the plugin copied changed (the corpus's false alarms: ATOM's `Sampler.greedy_sample` copy, fp4local's
partial `_prepare_weights`). `copied_part: {UPSTREAM: [ANCHOR, ...]}` names each copied statement by its first
line as `ast.unparse` writes it (so formatting never matters): each anchor must match exactly one statement of
the body, at any depth (a whole `if` branch is one statement). The part's digest is pinned beside the body's;
when the body changed but the part did not, the change is outside what was copied (compatible), and a part whose
anchors no longer match one statement each is gone (breaking). One reading for `check` and the loader.
"""

from __future__ import annotations

import ast
import hashlib
from typing import Union


def _first_line(stmt: ast.stmt) -> str:
    text = ast.unparse(stmt)
    return text.splitlines()[0].strip() if text else ""


def _statements(node: ast.AST, within: tuple[str, ...] = ()) -> list[tuple[ast.stmt, tuple[str, ...]]]:
    """Every statement of the def, with the first lines of the compound statements enclosing it (in the def)."""
    out = []
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, None) or ():
            if isinstance(child, ast.stmt):
                out.append((child, within))
                out.extend(_statements(child, within + (_first_line(child),)))
            elif isinstance(child, (ast.ExceptHandler, getattr(ast, "match_case", ast.ExceptHandler))):
                out.extend(_statements(child, within + (type(child).__name__,)))
    return out


def anchored(node: ast.AST, anchors: list[str]) -> Union[list[tuple[ast.stmt, tuple[str, ...]]], str]:
    """The statements `anchors` name in the def `node` (each with what encloses it), in the anchors' order; or
    why they cannot be found."""
    by_line: dict[str, list[tuple[ast.stmt, tuple[str, ...]]]] = {}
    for stmt, within in _statements(node):
        by_line.setdefault(_first_line(stmt), []).append((stmt, within))
    found = []
    for anchor in anchors:
        hits = by_line.get(anchor.strip(), [])
        if len(hits) != 1:
            what = "no statement" if not hits else f"{len(hits)} statements"
            return (f"the copied part's anchor {anchor!r} matches {what} of the body (an anchor is the first line "
                    "of one statement as ast.unparse writes it)")
        found.append(hits[0])
    return found


def part_digest(node: ast.AST, anchors: list[str]) -> Union[str, tuple[str]]:
    """`sha256:…` of the named statements (normalised AST, like `source_digest`) and of the conditions enclosing
    each (a copied statement upstream moved under a new `if` has changed), or (why,) when not found."""
    got = anchored(node, anchors)
    if isinstance(got, str):
        return (got,)
    text = "\n".join(" > ".join(within) + " | " + ast.dump(s, annotate_fields=False) for s, within in got)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def outside(anchors: list[str]) -> str:
    """The judgement when the body changed and the part did not."""
    return (f"the body changed outside the part the implementation copies ({len(anchors)} statement"
            f"{'s' if len(anchors) != 1 else ''} from {anchors[0]!r}, `copied_part`), which is unchanged: "
            "nothing to re-sync")
