"""GET /patchkit/status on vLLM's API server: `vllm-patchkit status --json` of the server's own run.

HTTP 200 when status would exit 0, else 503, so it works as a readiness probe.
Read-only (GET only, no parameters: the run and the directory are the server's
own) and never more than the CLI shows, since the body is the CLI's JSON.

The API key: vLLM's AuthenticationMiddleware guards only /v1, /v2, /inference and
/cohere. The route checks the same tokens with the same code: the tokens the
middleware was added with (so --api-key wins over VLLM_API_KEY exactly as there)
and vLLM's own `verify_token` (Bearer, sha256 + constant-time compare), and
answers as it does (401 {"error": "Unauthorized"}). No middleware, no check:
as for /v1.

A flood costs one read of the records per second: the answer is cached for
CACHE_SECONDS (below the default flush interval of 2 s) and reads are
single-flight, off the event loop.

Bounded: records are read as `status` reads them (regular files only, never followed, never blocking, at
most VLLM_PATCHKIT_MAX_RECORD_BYTES each), and a body over MAX_BODY_BYTES is replaced by a short one (exit
code, problems and warnings cut to their first MAX_LINES, one line per process) that says so in `truncated`.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Optional

from fastapi import Request  # at module level: FastAPI resolves the handler's annotation from here
from fastapi.responses import JSONResponse, Response

from vllm_patchkit.reporting.run_folder import load_run
from vllm_patchkit.reporting.status import json_of
from vllm_patchkit.reporting.verdict import judge

ROUTE = "/patchkit/status"
GATHERED_HEADER = "X-Patchkit-Workers"
CACHE_SECONDS = 1.0
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_LINES = 200


def bounded(body: str, limit: int = MAX_BODY_BYTES) -> str:
    """`body` (status --json's text) when it is at most `limit` bytes; else a short body with the same exit code
    that says it was cut."""
    if len(body) <= limit // 4 or len(body.encode()) <= limit:
        return body
    data = json.loads(body)

    def cut(lines: list) -> list:
        lines = [str(x)[:2000] for x in lines]
        return lines[:MAX_LINES] + ([f"... and {len(lines) - MAX_LINES} more"] if len(lines) > MAX_LINES else [])

    short = {
        "run_id": data.get("run_id"), "exit_code": data.get("exit_code"),
        "truncated": f"the full body is {len(body.encode())} bytes, over {limit}: patch rows left out here; "
                     "`vllm-patchkit status --json` on the server's host prints them all",
        "problems": cut(data.get("problems") or []), "warnings": cut(data.get("warnings") or []),
        "refused": cut(data.get("refused") or []),
        "processes": [{k: p.get(k) for k in ("role", "pid", "host", "ended")} for p in
                      (data.get("processes") or [])[:MAX_LINES]],
    }
    out = json.dumps(short, indent=1)
    if len(out.encode()) > limit:
        out = json.dumps({"run_id": str(data.get("run_id"))[:200], "exit_code": data.get("exit_code"),
                          "truncated": short["truncated"]})
    return out


class Snapshot:
    """The route's answer, read at most once per CACHE_SECONDS however many requests arrive."""

    def __init__(self, base: Path, run_id: Optional[str], min_steps: int = 8, ttl: float = CACHE_SECONDS,
                 gatherer: Any = None):
        self.base, self.run_id, self.min_steps, self.ttl = Path(base), run_id, min_steps, ttl
        self.gatherer = gatherer  # gather.Gatherer: the workers' records over collective_rpc, or None
        self.gathered = 0  # processes the last read added from the gather (not in the local directory)
        self._at = -1e18
        self._value: tuple[str, int] = ("", 2)
        self._lock: Optional[asyncio.Lock] = None

    def _fresh(self) -> bool:
        return time.monotonic() - self._at < self.ttl

    async def read(self) -> tuple[str, int]:
        if self._fresh():
            return self._value
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._fresh():
                if self.gatherer is not None:
                    await self.gatherer.fetch()
                loop = asyncio.get_running_loop()
                self._value = await loop.run_in_executor(None, self._report)
                self._at = time.monotonic()
        return self._value

    def _report(self) -> tuple[str, int]:
        """`status.report` of the directory, with the workers' gathered records merged in (a no-op when every
        worker's file is in the directory, as on one host: then the body is exactly `status --json`'s)."""
        run = load_run(self.base, self.run_id)
        if self.gatherer is not None:
            before = len(run.processes) if run is not None else 0
            run = self.gatherer.apply(run)
            self.gathered = (len(run.processes) if run is not None else 0) - before
        verdict = judge(run, self.min_steps)  # one verdict: the body and the HTTP status say the same
        return bounded(json_of(verdict)), verdict.exit_code


def api_tokens(app: Any, auth_cls: type) -> Optional[list[str]]:
    """The tokens vLLM's AuthenticationMiddleware was added with on `app`, or None (no key configured)."""
    for mw in getattr(app, "user_middleware", []):
        if getattr(mw, "cls", None) is auth_cls:
            return list(mw.kwargs.get("tokens") or (mw.args[0] if mw.args else []))
    return None


def install(app: Any, base: Path, run_id: Optional[str], auth_cls: type, min_steps: int = 8,
            gatherer: Any = None) -> bool:
    """Add the route to `app` (built by vLLM's build_app); True when it sits behind the API key."""
    tokens = api_tokens(app, auth_cls)
    guard = auth_cls(None, tokens=tokens) if tokens else None  # vLLM's own check, never our copy of it
    snapshot = Snapshot(base, run_id, min_steps, gatherer=gatherer)

    async def patchkit_status(request: Request) -> Response:
        if guard is not None and not guard.verify_token(request.headers):
            return JSONResponse(content={"error": "Unauthorized"}, status_code=401)
        body, code = await snapshot.read()
        headers = {"Cache-Control": "no-store"}
        if gatherer is not None:  # how many workers answered over collective_rpc, and how many only that way
            headers[GATHERED_HEADER] = f"{len(gatherer.answers)} answered, {snapshot.gathered} not on disk here"
        return Response(content=body, status_code=200 if code == 0 else 503, media_type="application/json",
                        headers=headers)

    app.add_api_route(ROUTE, patchkit_status, methods=["GET"], include_in_schema=False)
    return guard is not None
