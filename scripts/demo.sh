#!/usr/bin/env bash
# Set up (scripts/setup.sh), build tiny models locally, serve them with the plugin auto-loaded (a Llama, the V4
# stand-in, the stateful V4 stand-in), send completions, print `vllm-patchkit status` for each, stop the servers.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup.sh" | tail -1)"
exec "$VENV/bin/python" -m patchkit_deepseek_v4.demo "$@"
