"""The scan as a table (rich) or JSON."""

from __future__ import annotations

import io
import json

from vllm_patchkit.reporting.terminal_text import rich_text
from vllm_patchkit.tools.scan.model import ScanResult, Site


def declaration(site: Site) -> str:
    """`wrap instances: true` / `set value_from: m:X` / `— why not`: the table's last column."""
    if site.declare is None:
        return f"— {site.reason or 'not declarable'}"
    parts = [site.declare]
    for k, v in site.hints.items():
        if isinstance(v, list):
            v = ", ".join(map(str, v))
        elif isinstance(v, dict):
            v = ", ".join(f"{a}={b}" for a, b in v.items())
        elif isinstance(v, bool):
            v = str(v).lower()
        parts.append(f"{k}: {v}")
    return "  ".join(parts)


def render_table(result: ScanResult, width: int = 200) -> str:
    from rich.console import Console
    from rich.table import Table

    # a plugin's source is a third party's text: rich gets it as Text, never as markup (terminal_text)
    table = Table(title=rich_text(f"vllm-patchkit scan: {result.plugin} against {result.release or 'no vLLM release (names guessed)'}"),
                  show_lines=False, expand=False)
    for col in ("place at the release", "site", "where", "declare as (or why not)", "notes"):
        table.add_column(col, overflow="fold")
    for s in result.sites:
        place = s.place or (s.facts.get("env") if s.mechanism == "env" else "") or "?"
        if s.defined_at:
            place += f"\n(defined at {s.defined_at})"
        table.add_row(*(rich_text(c) for c in (place, s.mechanism, s.where, declaration(s), "; ".join(s.notes))))
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, highlight=False, markup=False, emoji=False)
    console.print(table)
    counts = ", ".join(f"{k} {v}" for k, v in result.counts().items()) or "none"
    console.print(rich_text(f"{len(result.sites)} site(s) in {result.files} file(s): {counts}"))
    declarable = sum(1 for s in result.sites if s.declare)
    console.print(f"{declarable} declarable; {len(result.sites) - declarable} not (reason in the table)")
    for f, e in result.errors:
        console.print(rich_text(f"finding: {f}: {e}"))
    return buf.getvalue()


def render_json(result: ScanResult) -> str:
    return json.dumps(result.to_json(), indent=2, default=repr) + "\n"


__all__ = ["declaration", "render_json", "render_table"]
