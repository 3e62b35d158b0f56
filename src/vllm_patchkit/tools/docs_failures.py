"""The failure-code page (docs/failure-codes.md), rendered from the codes' rows (`declaration/failures.py`) and
`check`'s word for each (`BreakageKind.failure_code`): one table, so the docs never name a code, a remedy or a
mapping the code does not have. Written and checked current with the YAML's pages (`vllm-patchkit docs`)."""

from __future__ import annotations

from vllm_patchkit.declaration.failures import ROWS, FailureRow
from vllm_patchkit.upstream.findings import LOADER_CODES, NOT_RECORDED, BreakageKind

NAME = "failure-codes.md"
HEADER = ("<!-- DO NOT EDIT: generated from src/vllm_patchkit/declaration/failures.py and "
          "src/vllm_patchkit/upstream/findings.py by `vllm-patchkit docs`. Edit the rows there, then run "
          "`vllm-patchkit docs`. -->\n\n")
#: how the table shows a remedy's placeholders (the installed release, the patch id)
SHOWN = {"v": "X", "pid": "ID"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(r: FailureRow, kinds: dict) -> str:
    remedy = r.remedy.format(**SHOWN) if r.remedy else "—"
    check = ", ".join(f"`{k.value}`" for k in kinds.get(r.code, ())) or "—"
    return (f"| `{r.code.value}` | {' / '.join(r.recorded)} | {_cell(r.meaning)} | "
            f"{'yes' if r.release_bound else 'no'} | {_cell(remedy)} | {check} |")


def render() -> str:
    kinds: dict = {}
    for kind in BreakageKind:
        if LOADER_CODES[kind] is not None:
            kinds.setdefault(LOADER_CODES[kind], []).append(kind)
    lines = [HEADER, "# Failure codes\n",
             "Every code the loader writes into a patch's record: its `code` (with the states it comes with), an "
             "entry of its `findings`, or a call-convention problem the loader joins into one `convention` finding "
             "(`check` reports each as `convention_mismatch`, the code in `new`). One enum, "
             "`vllm_patchkit.declaration.failures.FailureCode`, names them for the loader, `check`, the remedies and "
             "this page; how to read a record: [troubleshooting](troubleshooting.md).\n",
             "- **another release**: another vLLM release could cure it; a refusal's message then first offers "
             "\"use a vLLM release it is pinned for (...)\", naming the releases other than the installed one whose "
             "manifests list the patch (or says that none does).",
             f"- **remedy**: what the message of a needed required patch that fails so offers (`{SHOWN['v']}`: the "
             f"installed release); every message then offers `VLLM_PATCHKIT_ALLOW_UNPATCHED={SHOWN['pid']}` (or "
             "`all`) to serve without the patch, loudly.",
             "- **`check` reports it as**: the `BreakageKind`s whose change the loader records with this code, on "
             "the patch's target; on a place the implementation `uses` or copies (`reimplements`) the loader records "
             "the same changes as `uses`, on a declared copy as `copy`.\n",
             "| code | recorded | meaning | another release | remedy | `check` reports it as |",
             "|---|---|---|---|---|---|"]
    lines += [_row(r, kinds) for r in ROWS]
    lines += ["", "## What `check` reports and the loader records no code for\n"]
    lines += [f"- `{k.value}`: {why}" for k, why in NOT_RECORDED.items()]
    return "\n".join(lines) + "\n"
