"""``python -m patchkit_deepseek_v4.demo``: serve tiny models with the plugin auto-loaded, ask them, show what applied.

Why: one command that shows a maintainer the whole loop on any machine, with no model download and no
accelerator: vLLM really serving with the installed patches, then ``vllm-patchkit status`` reading what each
process recorded. Three serves, one after the other (about 2-3 minutes on a CPU):

1. ``llama``: the tiny Llama. Nothing of the DeepSeek-V4 set is for it: its rows say "skipped" with the
   architecture as the reason.
2. ``v4``: the same weights served as the plugin's ``DeepseekV4ForCausalLM`` by the test stand-in plugin (an
   out-of-tree class, ``PATCHKIT_STANDIN=1``), with vLLM's real CPU worker: the dispatch override counts the
   steps it overrode.
3. ``stateful``: the stateful V4 stand-in (docs/adapters/stateful-standin.md): vLLM's real API server,
   EngineCore, async scheduler and prefix cache over the plugin's KV shape, sized by the KV-config hook with
   the real DeepSeek-V4 adapter; the worker side is the stand-in executor, which keeps a per-request state and
   restores it from the published image on a prefix hit. A prompt is sent twice: the second restores.

The last two need the stand-in plugin (``pip install ./tests/plugins/standin``; ``scripts/setup.sh`` does it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from vllm_patchkit import ServerError, build_tiny_model, serve

PROMPTS = ("Hello, world!", "The quick brown fox", "Once upon a time", "What is the capital of France?")
SERVES = ("llama", "v4", "stateful")
STANDIN = "patchkit_standin.checkpoint"
# Records are flushed every VLLM_PATCHKIT_FLUSH_SECONDS; a short interval lets `status` show this run's calls
# while the server is still up.
FLUSH = {"VLLM_PATCHKIT_FLUSH_SECONDS": "0.5"}


def default_workdir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "vllm-patchkit" / "demo"


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # a broken parent package says the same
        return False


def _status(status_dir: Path, *extra: str) -> tuple[int, dict]:
    """Print `vllm-patchkit status` of this serve's run; return its exit code and its JSON."""
    cmd = [sys.executable, "-m", "vllm_patchkit.tools.cli", "status", "--dir", str(status_dir), *extra]
    print("$ vllm-patchkit status " + " ".join(extra), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout + res.stderr, end="")
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True)
    try:
        return res.returncode, json.loads(js.stdout)
    except ValueError:
        return res.returncode, {}


def _rows(report: dict, role: str) -> dict:
    for proc in report.get("processes", []):
        if proc.get("role") == role:
            return {r["patch"].split("@")[0]: r for r in proc.get("patches", [])}
    return {}


def _serve_llama(workdir: Path, timeout: float) -> str:
    model = build_tiny_model(workdir / "tiny-llama")
    status_dir = workdir / "status-llama"
    with serve(model, log_path=workdir / "server-llama.log", timeout=timeout,
               env={**FLUSH, "VLLM_PATCHKIT_STATUS_DIR": str(status_dir)}) as srv:
        for prompt in PROMPTS:
            text = srv.complete(prompt, max_tokens=12)["choices"][0]["text"]
            print(f"  {prompt!r} -> {text!r}")
        time.sleep(1.5)
        code, report = _status(status_dir)
    skipped = [r for r in _rows(report, "engine_core").values()
               if r.get("patch_set") == "deepseek-v4" and r.get("code") == "precondition"]
    why = skipped[0].get("reason", "") if skipped else ""
    return (f"tiny Llama: {len(skipped)} DeepSeek-V4 patches skipped in EngineCore ({why}); "
            f"status exit {code}")


def _serve_v4(workdir: Path, timeout: float) -> str:
    model = build_tiny_model(workdir / "tiny-v4", "DeepseekV4ForCausalLM")
    status_dir = workdir / "status-v4"
    with serve(model, log_path=workdir / "server-v4.log", timeout=timeout,
               env={**FLUSH, "VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "PATCHKIT_STANDIN": "1"}) as srv:
        for prompt in PROMPTS:
            srv.complete(prompt, max_tokens=12)
        time.sleep(1.5)
        code, report = _status(status_dir, "--set", "deepseek-v4")
    row = _rows(report, "worker").get("batch-dispatch-override", {})
    counts = row.get("detail") or {}
    return (f"V4 stand-in: batch-dispatch-override {row.get('state', 'absent')} in the worker, "
            f"{counts.get('steps_overridden', 0)} of {counts.get('steps_seen', 0)} steps overridden; "
            f"status exit {code}")


def _serve_stateful(workdir: Path, timeout: float) -> str:
    from patchkit_standin.checkpoint import EXECUTOR, build_v4_checkpoint

    model = build_v4_checkpoint(workdir / "tiny-v4-stateful")
    status_dir = workdir / "status-stateful"
    env = {**FLUSH, "VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "PATCHKIT_STANDIN": "1",
           "PATCHKIT_STANDIN_ASYNC": "1", "VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS": "256"}
    args = ["--distributed-executor-backend", EXECUTOR, "--enable-prefix-caching", "--mamba-cache-mode", "align",
            "--block-size", "128", "--max-model-len", "1024", "--max-num-seqs", "8"]
    prompt = [3 + (i * 7919) % 497 for i in range(300)]  # 300 tokens: an image at 256 (rung and anchor)
    with serve(model, log_path=workdir / "server-stateful.log", timeout=timeout, env=env, extra_args=args) as srv:
        for attempt in ("first", "again"):
            out = srv.complete_tokens(prompt, max_tokens=4)
            cached = ((out.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
            print(f"  300-token prompt, {attempt}: {out['usage']['completion_tokens']} tokens"
                  + (f", {cached} prompt tokens from the prefix cache" if cached is not None else ""))
        time.sleep(1.5)
        code, report = _status(status_dir, "--set", "deepseek-v4")
    rows = _rows(report, "engine_core")
    last = (rows.get("kv-config-hook", {}).get("detail") or {}).get("last_call") or {}
    plan = last.get("plan") or {}
    pub = rows.get("image-publish", {}).get("detail") or {}
    engine = next((p for p in report.get("processes", []) if p.get("role") == "engine_core"), {})
    state = (engine.get("counters") or {}).get("patchkit_standin.state_executor", {})
    return (f"stateful V4: KV pool {last.get('decision', '?')} by the adapter (page {plan.get('page_bytes', '?')} B, "
            f"k = {plan.get('k', '?')}, {plan.get('withheld', '?')} of {plan.get('physical', '?')} blocks withheld "
            f"for {plan.get('num_slots', '?')} state slots); "
            f"images published {pub.get('published', 0)}, deferred {pub.get('deferred', 0)}; "
            f"prefix-hit restores {state.get('restores_right', 0)} right, {state.get('restores_wrong', 0)} wrong, "
            f"stores {state.get('stores', 0)}; status exit {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m patchkit_deepseek_v4.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=default_workdir(),
                        help="where the tiny models, status folders and server logs go (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds to wait for each server")
    parser.add_argument("--only", choices=SERVES, action="append",
                        help="run only this serve (repeatable; default: all three)")
    args = parser.parse_args(argv)
    workdir = args.workdir.expanduser()
    wanted = args.only or list(SERVES)
    if not _importable("vllm_patchkit.tools.cli"):
        print("error: vllm_patchkit.tools.cli is not importable; install the project first", file=sys.stderr)
        return 1
    have_standin = _importable(STANDIN)
    summary, failed = [], False
    for name in wanted:
        if name != "llama" and not have_standin:
            summary.append(f"{name}: not run (pip install ./tests/plugins/standin; scripts/setup.sh does it)")
            continue
        print(f"\n=== {name}: starting vLLM (typically 30-60 s on a CPU); log in {workdir}/server-{name}.log",
              flush=True)
        start = time.monotonic()
        try:
            line = {"llama": _serve_llama, "v4": _serve_v4, "stateful": _serve_stateful}[name](workdir, args.timeout)
        except ServerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            summary.append(f"{name}: the server failed (see its log)")
            failed = True
            continue
        summary.append(f"{line}  [{time.monotonic() - start:.0f} s]")
    print("\n=== what the framework did")
    for line in summary:
        print("  " + line)
    return 1 if failed or any("status exit 0" not in s for s in summary if "not run" not in s) else 0


if __name__ == "__main__":
    raise SystemExit(main())
