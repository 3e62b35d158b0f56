"""Renderers of a multi-release check (`matrix.Matrix`): the patch × release table and the requirement line for
people, the same as JSON for machines, GitHub annotations for CI. Cells use check's own statuses."""

from __future__ import annotations

import json
import textwrap

from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.tools.matrix import Matrix
from vllm_patchkit.reporting.terminal_text import printable
from vllm_patchkit.tools.render import counts_line, render_github, report_doc
from vllm_patchkit.tools.report import PatchResult

LABEL = {"ok": "ok", "compatible": "compatible", "stale": "STALE", "broken": "BROKEN", "unpinned": "UNPINNED",
         "not_applicable": "n/a"}
LEGEND = ("cells: the patch's status on that release, as `check --vllm X` gives it: ok, compatible (differences "
          "it survives, against older pins), STALE, BROKEN, UNPINNED, n/a (not applicable); '+retirable': it can "
          "be retired there; @N: the patch version checked, when it differs between releases")


def cell(res: PatchResult, show_version: bool) -> str:
    text = LABEL[res.status] + (f" @{PatchKey.parse(res.patch).version}" if show_version and "@" in res.patch else "")
    return text + (" +retirable" if res.retire else "")


def render_text(m: Matrix) -> str:
    rows = m.rows()
    width = max([len("patch")] + [len(r.patch) + 2 for r in rows])
    cells = {}
    for r in rows:
        several = len({res.patch for res in r.cells.values()}) > 1
        cells[r.patch] = [cell(r.cells[rel], several) if rel in r.cells else "-" for rel in m.releases]
    col = max([len(rel) for rel in m.releases] + [len(c) for cs in cells.values() for c in cs]) + 2
    lines = [f"vllm-patchkit check: {len(m.releases)} releases ({', '.join(m.releases)})",
             f"{'patch':<{width}} {'required':<9}" + "".join(f"{rel:<{col}}" for rel in m.releases).rstrip()]
    for r in rows:
        lines.append((f"{r.patch:<{width}} {'yes' if r.required else 'no':<9}"
                      + "".join(f"{c:<{col}}" for c in cells[r.patch])).rstrip())
    lines.extend(textwrap.wrap(LEGEND, 116, subsequent_indent='  '))
    for rel in m.releases:
        report = m.reports[rel]
        lines.append(f"{rel}: {report.release}: exit {report.exit_code()}")
        lines.append(f"  {counts_line(report)}")
        lines.extend(f"  - [{f.kind.value}] {f.explain()}" for f in report.findings())
    lines.extend(_requirement_lines(m))
    return printable("\n".join(lines)) + "\n"


def _requirement_lines(m: Matrix) -> list[str]:
    req = m.requirement()
    lines = [f"requirement (pyproject.toml): {req.line or 'none'}"]
    if req.supported:
        lines.append(f"  supported: {', '.join(req.supported)}")
    for rel in req.unsupported:
        lines.append(f"  not supported: {rel} ({'; '.join(m.blockers(rel))})")
    lines.extend(f"  excluded: {clause} ({why})" for clause, why in req.excluded)
    lines.extend(f"  note: {n}" for n in [*req.notes, *m.notes()])
    return lines


def as_doc(m: Matrix) -> dict:
    req = m.requirement()
    return {
        "releases": list(m.releases), "ok": m.exit_code() == 0, "exit_code": m.exit_code(),
        "matrix": [{"patch": r.patch, "required": r.required,
                    "cells": {rel: {"status": res.status, "patch": res.patch, "retirable": res.retire,
                                    "pins_from": res.pins_from} for rel, res in r.cells.items()}}
                   for r in m.rows()],
        "requirement": req.as_dict(),
        "blockers": {rel: m.blockers(rel) for rel in req.unsupported},
        "notes": m.notes(),
        "reports": {rel: report_doc(m.reports[rel]) for rel in m.releases},
    }


def render_json(m: Matrix) -> str:
    return json.dumps(as_doc(m), indent=2) + "\n"


def render_gh(m: Matrix) -> str:
    """Each release's annotations, then a notice with the requirement line (an error when none is supported)."""
    out = "".join(render_github(m.reports[rel]) for rel in m.releases)
    req = m.requirement()
    if req.line is None:
        return out + f"::error title=no supported vLLM release::{'; '.join(req.notes)}\n"
    return out + f"::notice title=vLLM requirement line::{req.line} (supported: {', '.join(req.supported)})\n"


RENDER = {"text": render_text, "json": render_json, "github": render_gh}
