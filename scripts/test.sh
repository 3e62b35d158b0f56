#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, end-to-end serves included.
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -m "not e2e"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup.sh" | tail -1)"
cd "$ROOT"
if [ -x scripts/fetch_wheels.sh ] || [ -f scripts/fetch_wheels.sh ]; then
    bash scripts/fetch_wheels.sh || echo "warning: could not fetch vLLM 0.32/0.33 wheels; their static checks will skip"
fi
exec "$VENV/bin/python" -m pytest -q "$@"
