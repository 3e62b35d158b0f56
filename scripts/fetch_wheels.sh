#!/usr/bin/env bash
# Download the vLLM wheels the static contract checks read, into the wheel cache.
#
#   VLLM_PATCHKIT_WHEEL_CACHE=~/.cache/vllm-patchkit/wheels scripts/fetch_wheels.sh [VERSION ...]
#
# Default versions: every release with a manifest in manifests/ that is not the
# installed one. A wheel already in the cache is not downloaded again (CI caches
# the folder between runs). Wheels are ~320 MB each: never commit them.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${VLLM_PATCHKIT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-patchkit/wheels}"
python="${PYTHON:-python}"
mkdir -p "$cache"

if [ "$#" -gt 0 ]; then
  versions=("$@")
else
  installed="$("$python" -c 'from vllm_patchkit.contracts import installed_version; print(installed_version() or "")' 2>/dev/null || true)"
  versions=()
  for m in "$here"/manifests/vllm-*.yaml; do
    v="$(basename "$m" .yaml)"; v="${v#vllm-}"
    [ "$v" = "$installed" ] || versions+=("$v")
  done
fi

for v in "${versions[@]}"; do
  if compgen -G "$cache/vllm-$v-*.whl" > /dev/null; then
    echo "cached: $(ls "$cache"/vllm-"$v"-*.whl)"
    continue
  fi
  echo "downloading vllm==$v into $cache"
  "$python" -m pip download --no-deps --only-binary=:all: --dest "$cache" "vllm==$v"
done
echo "export VLLM_PATCHKIT_WHEEL_CACHE=$cache"
