"""Untrusted text is data (issue 33, item 4): what a record, a patch file, an exception or a third party wrote is
shown as it reads, never interpreted as rich markup or terminal control; `--json` keeps it verbatim.

Before: `vllm-patchkit status` printed record text through rich with markup on: an exception text holding
`[/opt/x/libfoo.so]` raised rich's MarkupError (the table and the remedy lost, a traceback instead), and raw
escapes (clear screen, a line rewritten as "OK") reached the terminal.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from vllm_patchkit.reporting import status, verdict
from vllm_patchkit.reporting.terminal_text import printable
from vllm_patchkit.runtime.record import PatchRecord, ProcessRecord, process_file, write_atomic
from vllm_patchkit.tools.cli import main as cli_main

RUN = "20260101T000000-1-abcdef"
HOSTILE = ["[/opt/x/libfoo.so]", "[bold red]OK[/]", "\x1b[2J", "\x1b[1A\rOK", "\x9b31m", ":thumbs_up:",
           "\u202eKO"]
TEXT = " | ".join(HOSTILE)
# what a terminal would act on: ESC, C1 (the 8-bit CSI among them), a bare CR, the other C0 but \n and \t
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")


def _hostile_run(base: Path) -> None:
    rec = PatchRecord(patch="kv@1", patch_set="deepseek-v4", kind="wrap", required=True, stage="import",
                      target="vllm.v1.core.kv_cache_utils:get_kv_cache_configs", state="failed", code="apply",
                      reason=f"installing it raised OSError: {TEXT}", expected=TEXT, found=TEXT,
                      detail={"exception": TEXT, "remedy": TEXT},
                      findings=[{"code": "conflict", "where": TEXT}], warning=TEXT)
    proc = ProcessRecord(run_id=RUN, role="frontend", pid=4242, ppid=1, vllm_version="0.31.0", started=time.time(),
                         patches=[rec], warnings=[TEXT], counters={TEXT: {TEXT: 3}},
                         error=f"vllm-patchkit: required patch kv@1 failed: {TEXT}. Remedies: {TEXT}")
    write_atomic(process_file(base, proc), proc.to_json())


def _status(capsys, base: Path, *extra: str) -> tuple[int, str]:
    code = cli_main(["status", "--dir", str(base), "--run", RUN, *extra])
    return code, capsys.readouterr().out


def test_status_table_shows_hostile_text_as_text(tmp_path, capsys):
    base = tmp_path / "status"
    _hostile_run(base)
    code, out = _status(capsys, base)
    assert code == verdict.BAD  # the failed required patch still decides the exit code
    assert "kv@1" in out and "start-up stopped in frontend (pid 4242)" in out
    # the brackets are shown literally (rich wrapped the cell, so look in the unwrapped lines of the error)
    tail = out[out.index("start-up stopped"):]
    assert "[/opt/x/libfoo.so]" in tail and "[bold red]OK[/]" in tail and ":thumbs_up:" in tail
    assert "\U0001f44d" not in out  # no emoji code replaced
    # no control reaches the terminal; each is shown as its escape
    assert not _CONTROL.findall(out), sorted(set(_CONTROL.findall(out)))
    assert "\\x1b[2J" in tail and "\\x1b[1A\\rOK" in tail and "\\x9b31m" in tail and "\\u202eKO" in tail
    for line in ("problem:", "warning:"):
        assert line in out


def test_status_json_keeps_the_text_verbatim(tmp_path, capsys):
    base = tmp_path / "status"
    _hostile_run(base)
    code, out = _status(capsys, base, "--json")
    data = json.loads(out)
    assert code == data["exit_code"] == verdict.BAD
    rec = data["processes"][0]["patches"][0]
    assert rec["expected"] == rec["found"] == rec["detail"]["exception"] == rec["detail"]["remedy"] == TEXT
    assert data["processes"][0]["error"].endswith(f"Remedies: {TEXT}")
    assert TEXT in data["processes"][0]["warnings"]


@pytest.mark.parametrize("text", HOSTILE)
def test_each_hostile_text_alone_renders(tmp_path, text):
    """One at a time in the reason, as `vllm-patchkit status` renders it (before: MarkupError on the first two)."""
    from vllm_patchkit.reporting.run_folder import load_run

    base = tmp_path / "status"
    rec = PatchRecord(patch="p@1", kind="wrap", required=False, stage="import", state="failed", reason=text)
    proc = ProcessRecord(run_id=RUN, role="worker", pid=7, ppid=1, vllm_version="0.31.0", started=time.time(),
                         patches=[rec])
    write_atomic(process_file(base, proc), proc.to_json())
    out = status.render(load_run(base, RUN))
    assert printable(text) in out and not _CONTROL.findall(out)


def test_printable_keeps_ordinary_text_and_newlines():
    assert printable("a [b] c\n\td ü →") == "a [b] c\n\td ü →"
    assert printable("a\nb", newlines=False) == "a\\nb"
    assert printable("\x1b]0;title\x07rest") == "\\x1b]0;title\\x07rest"


def test_check_and_doctor_renderers_strip_control(monkeypatch):
    """`check`'s text renderer and `doctor`'s: the same text (a note, a diagnosis) shown without control."""
    from vllm_patchkit.tools import doctor
    from vllm_patchkit.tools.render import render_text
    from vllm_patchkit.tools.report import PatchResult, Report

    report = Report(vllm="0.31.0", release=f"vLLM {TEXT}",
                    results=[PatchResult(patch="p@1", status="not_applicable", note=TEXT)])
    out = render_text(report)
    assert "[/opt/x/libfoo.so]" in out and not _CONTROL.findall(out), out
    out = doctor.render([doctor.Diagnosis("torch", False, TEXT, TEXT)])
    assert "[bold red]OK[/]" in out and not _CONTROL.findall(out), out
