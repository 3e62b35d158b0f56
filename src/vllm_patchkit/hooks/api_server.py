"""Operator endpoints: put the run's patch status where operators look, on vLLM's own API server.

Wraps vLLM's `build_app`: after vLLM built the FastAPI app (routers, /metrics,
middleware), register the record-reading collector on the registry vLLM's
/metrics serves, and add GET /patchkit/status. The server's own run and status
directory are this process's (the front end made the run id). Nothing here may
stop the server: a failure is logged and noted in this patch's record.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from vllm_patchkit.reporting import gather, route as http_status
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.record import RUN_ID_ENV, default_status_dir

log = logging.getLogger("vllm.patchkit")


def _run_of_this_server() -> tuple[Path, str | None]:
    loader = runtime.current()
    if loader is not None:
        return Path(loader.status_dir or default_status_dir()), loader.process.run_id
    return default_status_dir(), os.environ.get(RUN_ID_ENV)


def after_build_app(wrapped, instance, args, kwargs, ctx):
    """vLLM builds the app exactly as it would; then the two operator endpoints are added to it."""
    app = wrapped(*args, **kwargs)
    base, run_id = _run_of_this_server()
    gatherer = gather.Gatherer(app)  # workers on other hosts: their records over vLLM's collective_rpc
    notes = {}
    try:
        registry = ctx.use("get_prometheus_registry")()
        from prometheus_client import REGISTRY

        # imported once vLLM has built its app (and imported prometheus_client): not at start-up, where the
        # front end has not imported it yet (benchmarks/startup.py: no module vLLM would not have imported)
        from vllm_patchkit.reporting import metrics

        if registry is REGISTRY:
            metrics.install(registry, base, run_id, gatherer=gatherer)
            notes["metrics"] = "on /metrics"
        else:  # PROMETHEUS_MULTIPROC_DIR (--api-server-count > 1): vLLM's /metrics reads only the mmap files
            notes["metrics"] = "not on /metrics: multiprocess Prometheus mode shows only vLLM's files"
    except Exception as exc:
        log.warning("vllm-patchkit: patch metrics not added to /metrics: %s", exc)
        notes["metrics"] = f"not added: {exc}"
    try:
        keyed = http_status.install(app, base, run_id, ctx.use("AuthenticationMiddleware"), gatherer=gatherer)
        notes["route"] = f"GET {http_status.ROUTE}" + (" (API key required)" if keyed else "")
    except Exception as exc:
        log.warning("vllm-patchkit: %s not added: %s", http_status.ROUTE, exc)
        notes["route"] = f"not added: {exc}"
    ctx.note(**notes)
    return app
