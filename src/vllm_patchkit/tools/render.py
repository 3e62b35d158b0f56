"""Renderers of a check report: text for people, JSON for machines, GitHub annotations for CI."""

from __future__ import annotations

import json
import os
from typing import Optional

from vllm_patchkit.reporting.terminal_text import printable
from vllm_patchkit.tools.report import Report
from vllm_patchkit.upstream.sourcediff import cut


# -- rendering ----------------------------------------------------------------------------------
def render_text(report: Report) -> str:
    """For people: every text from a patch file, a manifest or the release is shown with control characters
    made visible (`terminal_text.printable`)."""
    lines = [f"vllm-patchkit check: {report.release}"]
    for r in report.results:
        label = {"ok": "ok", "compatible": "carry", "stale": "STALE", "broken": "BROKEN", "not_applicable": "n/a",
                 "unpinned": "UNPINNED"}[r.status]
        pins = f" (pins of vLLM {r.pins_from})" if r.pins_from and r.status != "not_applicable" else ""
        lines.append(f"  {label:<9} {r.patch}{pins}" + (f": {r.note}" if r.note and r.status == "not_applicable" else ""))
        if r.note and r.status != "not_applicable":
            lines.append(f"            note: {r.note}")
        if r.retire:
            lines.append(f"            retirable: {r.retire}")
        elif r.kept:
            lines.append(f"            not retirable: {r.kept}")
    findings = report.findings()
    breaking = [f for f in findings if f.breakage.breaking]
    if breaking:  # the heading only over what breaks: a compatible change is no breakage
        lines.append("breakages, by target:")
        for f in breaking:
            lines.append(f"  - [{f.kind.value}] {f.explain()}")
            if f.breakage.diff:
                lines.extend(f"      {line}" for line in cut(f.breakage.diff).splitlines())
    compatible = folded([f for f in findings if not f.breakage.breaking])
    if compatible:
        lines.append("compatible changes (the patches survive them):")
        for f, targets in compatible:
            if len(targets) == 1:
                lines.append(f"  - [{f.kind.value}] {f.explain()}")
            else:
                body = f.explain()[len(f.target) + 2:]
                shown = ", ".join(targets[:3]) + (f", and {len(targets) - 3} more" if len(targets) > 3 else "")
                lines.append(f"  - [{f.kind.value}] {len(targets)} places: {body} ({shown})")
    lines.append(counts_line(report))
    return printable("\n".join(lines)) + "\n"


def folded(findings: list) -> list[tuple]:
    """Findings that read the same but for their place (one per copy of a target), as one (finding, places)."""
    groups: dict[tuple, tuple] = {}
    for f in findings:
        body = f.explain()[len(f.target) + 2:]
        key = (f.kind, f.patches, body)
        groups.setdefault(key, (f, []))[1].append(f.target)
    return list(groups.values())


def counts_line(report: Report) -> str:
    c = report.counts()
    return (f"{c['ok']} ok, {c['compatible']} compatible, {c['stale']} stale, {c['broken']} broken, "
            f"{c['unpinned']} unpinned, {c['not_applicable']} not applicable, {c['retirable']} retirable "
            f"on vLLM {report.vllm}")


def report_doc(report: Report) -> dict:
    """`breakages`: each once, by target, with the `patches` it affects; `patches[].breakages` keeps the
    per-patch view (each patch's own findings) for readers of the earlier format."""
    return {"vllm": report.vllm, "release": report.release, "ok": not report.failed,
            "counts": report.counts(), "breakages": [f.as_dict() for f in report.findings()],
            "patches": [r.as_dict() for r in report.results]}


def render_json(report: Report) -> str:
    return json.dumps(report_doc(report), indent=2) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    s = printable(s).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return s.replace(":", "%3A").replace(",", "%2C") if prop else s


def render_github(report: Report) -> str:
    """GitHub Actions workflow commands: one `::error` per breakage (once per target, titled with the
    patches it affects, at the first one's file), a `::notice` per retirable patch."""
    def file_of(patch: Optional[str]) -> str:
        path = next((r.file for r in report.results if r.patch == patch and r.file), None)
        try:
            return f"file={_gh_escape(os.path.relpath(path), True)}," if path else ""
        except ValueError:
            return ""

    lines = []
    for f in report.findings():
        if not f.breakage.breaking:
            title = _gh_escape(f"{', '.join(f.patches)}: compatible change on vLLM {report.vllm} ({f.kind.value})", True)
            lines.append(f"::notice {file_of(f.patches[0])}title={title}::{_gh_escape(f.explain())}")
            continue
        verb = "breaks" if len(f.patches) == 1 else "break"
        title = _gh_escape(f"{', '.join(f.patches)} {verb} on vLLM {report.vllm} ({f.kind.value})", True)
        text = f.breakage.explain() + (f"\n{cut(f.breakage.diff)}" if f.breakage.diff else "")
        lines.append(f"::error {file_of(f.patches[0])}title={title}::{_gh_escape(text)}")
    for r in report.results:
        file = file_of(r.patch)
        if r.retire:
            title = _gh_escape(f"{r.patch} can be retired on vLLM {report.vllm}", True)
            lines.append(f"::notice {file}title={title}::{_gh_escape(r.retire)}")
    c = report.counts()
    lines.append(f"vllm-patchkit check vLLM {report.vllm}: {c['ok']} ok, {c['compatible']} compatible, "
                 f"{c['stale']} stale, {c['broken']} broken, {c['unpinned']} unpinned,"
                 f" {c['not_applicable']} not applicable, {c['retirable']} retirable")
    return "\n".join(lines) + "\n"


RENDER = {"text": render_text, "json": render_json, "github": render_github}
