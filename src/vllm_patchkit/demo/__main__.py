"""``python -m vllm_patchkit.demo``: build the tiny model, serve it, ask it, show status.

Why: one command that shows a maintainer the whole loop on any machine, with
no model download and no accelerator: vLLM really serving with the installed
patches, then ``vllm-patchkit status`` reading what each process recorded.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from .server import ServerError, serve
from .tiny_model import build_tiny_model

PROMPTS = ("Hello, world!", "The quick brown fox", "Once upon a time", "What is the capital of France?")


def default_workdir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "vllm-patchkit" / "demo"


def _has_cli() -> bool:
    try:
        return importlib.util.find_spec("vllm_patchkit.cli") is not None
    except Exception:  # a broken parent package says the same: no CLI to run
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_patchkit.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=default_workdir(),
                        help="where the tiny model and the server log go (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds to wait for the server")
    args = parser.parse_args(argv)

    workdir = args.workdir.expanduser()
    model = build_tiny_model(workdir / "tiny-llama")
    log_path = workdir / "server.log"
    print(f"model:  {model}\nlog:    {log_path}\nstarting vLLM (typically 30-60 s on a CPU) ...", flush=True)
    start = time.monotonic()
    try:
        # Records and counts are flushed every VLLM_PATCHKIT_FLUSH_SECONDS; a short interval
        # lets `status` below show this run's calls while the server is still up.
        env = {"VLLM_PATCHKIT_FLUSH_SECONDS": "0.5"}
        with serve(model, log_path=log_path, timeout=args.timeout, env=env) as srv:
            print(f"ready in {time.monotonic() - start:.1f} s at {srv.base_url} (pid {srv.pid})")
            for prompt in PROMPTS:
                text = srv.complete(prompt, max_tokens=12)["choices"][0]["text"]
                print(f"  {prompt!r} -> {text!r}")
            time.sleep(1.5)
            if _has_cli():
                cmd = [sys.executable, "-m", "vllm_patchkit.cli", "status"]
                print("$ " + " ".join(cmd), flush=True)
                res = subprocess.run(cmd, capture_output=True, text=True)
                print(res.stdout + res.stderr, end="")
                print(f"(status exit code {res.returncode})")
            else:
                print("note: vllm_patchkit.cli is not available yet; skipping `status`")
            print("stopping server ...", flush=True)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("stopped.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
