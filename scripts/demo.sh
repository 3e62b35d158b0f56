#!/usr/bin/env bash
# Set up (scripts/setup.sh), build a tiny model locally, serve it with the plugin auto-loaded,
# send a few completions, print `vllm-patchkit status`, stop the server.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup.sh" | tail -1)"
exec "$VENV/bin/python" -m vllm_patchkit.demo "$@"
