"""The record-count cap counts files that can be records, and remedies name commands an installed user has
(issue 33, item 6).

Before: `load_run` sorted every `*.json` of a run folder by name and read the first 1,024; 1,100 junk files whose
names sort before `engine_core-` / `frontend-` pushed the real records past the cap: `status` exited 2 "no
records" and the crash the front end recorded was no longer shown. And a manifest without a pin said "run
scripts/pin_manifest.py", a script only a checkout of this repository has.
"""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

from vllm_patchkit.reporting import run_folder, status, verdict
from vllm_patchkit.runtime.record import ProcessRecord, process_file, write_atomic
from vllm_patchkit.tools.cli import main as cli_main

RUN = "20260101T000000-1-abcdef"
CRASH = "vllm-patchkit: required patch kv-config-hook@2 failed: the crash the front end recorded"


def _record(base: Path, role: str, pid: int, **kw) -> Path:
    proc = ProcessRecord(run_id=RUN, role=role, pid=pid, ppid=1, vllm_version="0.31.0", started=time.time(), **kw)
    path = process_file(base, proc)
    write_atomic(path, proc.to_json())
    return path


def _junk_folder(tmp_path: Path) -> Path:
    base = tmp_path / "status"
    _record(base, "frontend", 4242, error=CRASH)
    _record(base, "engine_core", 4243)
    folder = base / RUN
    for i in range(1100):  # sort before "engine_core-" and "frontend-": 0... < a... < e...
        (folder / f"{i:04d}.json").write_text("not json")
    for i in range(50):  # named like a record of a role no vLLM process has
        (folder / f"aaaa-{i}.json").write_text("not json")
    for p in folder.iterdir():
        p.chmod(0o600)
    return base


def test_junk_files_never_crowd_out_the_real_records(tmp_path, capsys):
    base = _junk_folder(tmp_path)
    run = run_folder.load_run(base, RUN)
    assert [(p["role"], p["pid"]) for p in run.processes] == [("frontend", 4242), ("engine_core", 4243)]
    junk = [r for r in run.refused if "not named like a record" in r]
    assert len(junk) == 1 and junk[0].startswith("1100 file(s) of ") and "(<role>-<pid>.json)" in junk[0]
    # the 50 files of an unknown role are read (and refused one by one), after the known roles
    assert sum("aaaa-" in r and "not valid JSON" in r for r in run.refused) == 50
    assert not any("more than 1024" in r for r in run.refused)

    code = cli_main(["status", "--dir", str(base), "--run", RUN])
    out = capsys.readouterr().out
    assert code == verdict.BAD
    assert "start-up stopped in frontend (pid 4242)" in out and "the crash the front end recorded" in out


def test_cap_reads_known_roles_first(tmp_path):
    """More files named like records than the cap: the known roles' are the ones read."""
    base = tmp_path / "status"
    _record(base, "worker", 7)
    folder = base / RUN
    for i in range(run_folder.MAX_RECORDS_PER_RUN + 10):
        (folder / f"aaaa-{i}.json").write_text("x")
        (folder / f"aaaa-{i}.json").chmod(0o600)
    run = run_folder.load_run(base, RUN)
    assert [p["pid"] for p in run.processes] == [7]
    cap = [r for r in run.refused if "more than 1024" in r]
    assert len(cap) == 1 and cap[0].startswith("11 record file(s)")


def test_record_names_order_and_filter():
    names, others = run_folder.record_names(
        ["worker-10.json", "worker-9.json", "x-1.json", "frontend-3.json", ".worker-1.json.tmp", "notes.txt",
         "engine_core-2.json", "worker-1.json.bak", "junk.json", "worker--1.json"])
    assert names == ["frontend-3.json", "engine_core-2.json", "worker-9.json", "worker-10.json", "x-1.json"]
    assert others == ["junk.json", "worker--1.json"]


# -- every remedy names a command an installed user has ---------------------------------------------------------
SRC = Path(status.__file__).resolve().parents[1]


def _message_strings() -> list[tuple[str, int, str]]:
    """Every string constant of the package that is not a docstring: (file, line, text)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    docs.add(id(first.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                out.append((str(path.relative_to(SRC)), node.lineno, node.value))
    return out


def test_no_message_names_a_script_of_the_checkout():
    """Before: `no pin for X (run scripts/pin_manifest.py)`; `fetch it with scripts/fetch_wheels.sh X`."""
    hits = [(f, line, s) for f, line, s in _message_strings() if "scripts/" in s
            and not f.startswith("tools/scan/")]  # the scanner's own patterns read other repositories' scripts/
    allowed = [(f, s) for f, _, s in hits if "demo" in f]  # the demo runs from a checkout only
    assert [h for h in hits if (h[0], h[2]) not in allowed] == []


def test_every_command_a_message_names_exists():
    import argparse

    from vllm_patchkit.tools.cli import VERBS

    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    for add in VERBS:
        add(sub)
    verbs = set(sub.choices)
    named = {m for _, _, s in _message_strings() for m in re.findall(r"`vllm-patchkit ([a-z]+)", s)}
    assert named and named <= verbs, named - verbs


def test_missing_pin_names_the_pin_command(tmp_path):
    """A manifest entry without a pin for the patch's target: the real declaration path's message."""
    from vllm_patchkit.declaration.errors import PatchSetErrors

    from ..framework.helpers import make_loader, patch_doc

    kv = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
    doc = patch_doc(id="kv", kind="wrap", target=kv, processes=["frontend"], expected_calls="per_step")
    try:
        make_loader(tmp_path, {"kv": doc}, [{"patch": "kv@1", "targets": {}}])
    except PatchSetErrors as exc:
        problems = [e.problem for e in exc.errors]
    else:
        raise AssertionError("a manifest without the pin was accepted")
    assert problems == [f"no pin for {kv} (pin it: `vllm-patchkit pin --vllm 0.31.0`, review, commit)"]
