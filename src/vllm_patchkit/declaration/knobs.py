"""The framework's own environment variables, declared once: registered with vLLM and documented.

Each is what a patch's `env_vars` entry holds (`schema.EnvVar`), made here without running the validating
schema (every process registers them at start-up); a test validates each one (tests/framework/test_plugin.py)."""

from __future__ import annotations

from vllm_patchkit.declaration.schema import EnvVar

KNOBS = [
    EnvVar(name="VLLM_PATCHKIT_STATUS_DIR", default=None,
           doc="Where per-process records go. Default: $XDG_RUNTIME_DIR/vllm-patchkit, else ~/.cache/vllm-patchkit/status."),
    EnvVar(name="VLLM_PATCHKIT_RUN_ID", default=None,
           doc="Id of this server run; set by the first process and inherited by EngineCore and workers. Do not set by hand."),
    EnvVar(name="VLLM_PATCHKIT_ROLE", default=None,
           doc="Force the process role (frontend, engine_core, worker, inspect) instead of detecting it from the caller."),
    EnvVar(name="VLLM_PATCHKIT_ON_UNKNOWN_VLLM", default="nearest",
           doc="When no manifest pins the installed vLLM (a patch or post release, a dev build, a source tree): nearest (each needed patch is judged against the pins of the newest pinned release at or below it: applied only where every live fingerprint equals that pin, its record and `status` saying \"verified against the pins of X on Y\" as a warning; refused, naming each difference, otherwise; a vLLM older than every pinned release is handled as skip), skip (no pinned patch applies; a model that needs none serves with one warning, a model that needs a required patch is refused), error (stop start-up for every model)."),
    EnvVar(name="VLLM_PATCHKIT_TEST_VLLM_VERSION", default=None,
           doc="Test seam: `INSTALLED:REPORTED` (e.g. `0.31.0:0.31.1`) makes the loader judge the installed vLLM INSTALLED as REPORTED, to test a release no manifest pins on a real vLLM; ignored unless INSTALLED is the installed version; every process it acts in carries a warning `status` lists. Never set it in production."),
    EnvVar(name="VLLM_PATCHKIT_ALLOW_UNPATCHED", default=None,
           doc="Comma-separated patch ids (or `all`) a model needs but that may be absent: a required patch that cannot be applied on this release is then skipped instead of refusing start-up, logged as a warning and listed under `warnings` by `vllm-patchkit status`. At your own risk."),
    EnvVar(name="VLLM_PATCHKIT_DISABLE", default="0",
           doc="1 turns the plugin into a no-op that logs one line (for bisecting)."),
    EnvVar(name="VLLM_PATCHKIT_SHADOW_CHECK", default="1",
           doc="0 turns off the start-up check for class-level patches that the classes in use override without calling."),
    EnvVar(name="VLLM_PATCHKIT_FLUSH_SECONDS", default="2",
           doc="How often (seconds) a process rewrites its record file when counts changed; 0 = only at stage ends and exit."),
    EnvVar(name="VLLM_PATCHKIT_COUNT_CALLS", default="1",
           doc="0 installs every wrapper without its call counter (per patch: `count_calls: false`); inert detection then cannot judge."),
    EnvVar(name="VLLM_PATCHKIT_CACHE_DIR", default=None,
           doc="Where start-up caches go (the validated patch sets and manifests, live fingerprints, a dependency's folders), reused by every vLLM process of the installation and recomputed whenever a file they depend on changes. Default: $XDG_CACHE_HOME/vllm-patchkit/startup, else ~/.cache/vllm-patchkit/startup (created 0700; only this user's files are read). `off` turns them off."),
    EnvVar(name="VLLM_PATCHKIT_MAX_RECORD_BYTES", default="4194304",
           doc="Largest record file `vllm-patchkit status`, GET /patchkit/status and /metrics read (bytes); a larger one is refused by its size without being read, with a warning naming it."),
    EnvVar(name="VLLM_PATCHKIT_EXTRA_PATCHES", default=None,
           doc="Extra patch folders (os.pathsep-separated), e.g. a plugin's own; each may hold a manifests/ folder pinning its patches."),
]
