"""Helpers for the stateful stand-in serve (tests/e2e/test_stateful_standin_e2e.py).

* ``build_v4_checkpoint`` (from the stand-in plugin, ``patchkit_standin.checkpoint``, which the demo uses
  too): the tiny checkpoint named ``DeepseekV4ForCausalLM`` with the DeepSeek-V4 fields the real
  ``DeepseekV4Adapter`` reads added to its config.json.
* ``stream_and_cancel``: a streaming completion closed by the client after some chunks (vLLM aborts it).
* ``side_records``: the stand-in executor's counters from the run's status directory.
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path


from patchkit_standin.checkpoint import EXECUTOR, V4_FIELDS, build_v4_checkpoint  # noqa: F401 (re-exported)


def stream_and_cancel(base_url: str, model: str, prompt: list[int], max_tokens: int, cancel_after: int,
                      timeout: float = 60.0) -> int:
    """POST a streaming completion, read ``cancel_after`` data chunks, then close the connection.

    Returns the chunks read (fewer when the stream ended first)."""
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                       "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:500]!r}")
    seen = 0
    try:
        while seen < cancel_after:
            line = resp.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            if line == b"data: [DONE]":
                break
            seen += 1
    finally:
        if conn.sock is not None:
            conn.sock.close()  # the client goes away mid-stream: vLLM aborts the request
        conn.close()
    return seen


def side_records(status_dir: Path, run_id: str) -> list[dict]:
    """The stand-in executor's side files of one run (one per EngineCore)."""
    folder = Path(status_dir) / run_id / "standin"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("state-executor-*.json"))]
