"""The ATOM measurement never imports another platform's vLLM modules: proven under a guard that kills.

On the CPU build, `import vllm.platforms.rocm` imports `vllm._C`: on an AVX2-only CPU that is an illegal
instruction, on an AVX-512 CPU whose process already loaded the CPU ops a `TORCH_LIBRARY` abort; either way the
process dies with nothing to catch. Whether it dies depends on the CPU and on what was imported first, so a
plain run proves nothing on the machine at hand. Here a child process (`sys.executable -c`) installs a
`sys.meta_path` finder that calls `os.abort()` on any import of `vllm._C`, `vllm._rocm_C` or
`vllm.platforms.{rocm,cuda,xpu,tpu}` (and their submodules) — the death made certain on every CPU — and then:

- runs `scripts/atom_sites_report.py --json`, the code tests/contracts/test_atom_sites.py measures with:
  exit code 0, the figures of the data file's summary, and no `vllm` module imported at all;
- runs the old in-process resolution of a rocm target (`vllm_patchkit.upstream.targets.resolve`), and a bare
  `import vllm.platforms.rocm`: both die by SIGABRT, so the guard does bite.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "atom_sites_report.py"
DATA = REPO / "tests" / "data" / "atom_patch_sites.yaml"

GUARD = textwrap.dedent("""
    import os, sys

    FORBIDDEN = ("vllm._C", "vllm._rocm_C", "vllm.platforms.rocm", "vllm.platforms.cuda",
                 "vllm.platforms.xpu", "vllm.platforms.tpu")

    class AbortOnForeignPlatform:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                os.write(2, ("platform-isolation guard: import of " + name + "\\n").encode())
                os.abort()
            return None

    sys.meta_path.insert(0, AbortOnForeignPlatform())
""")


def _child(body: str, *args: str) -> subprocess.CompletedProcess:
    def no_core() -> None:  # an abort here is expected: no core file
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return subprocess.run([sys.executable, "-c", GUARD + textwrap.dedent(body), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, preexec_fn=no_core,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def _installed_vllm() -> str:
    from vllm_patchkit.tools.releases import installed_version

    v = installed_version()
    if v is None:
        pytest.skip("vLLM is not installed")
    return v.split("+")[0]


def test_atom_measurement_runs_under_the_guard():
    if _installed_vllm() != "0.31.0":
        pytest.skip("the ATOM figures are measured on vLLM 0.31.0")
    done = _child("""
        import runpy
        sys.argv = [sys.argv[1], "--json"]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        imported = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
        os.write(2, ("vllm modules imported: " + repr(imported) + "\\n").encode())
        sys.exit(code)
    """, str(SCRIPT))
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    assert "vllm modules imported: []" in done.stderr  # read statically: vLLM itself is never imported
    figures = json.loads(done.stdout)
    summary = yaml.safe_load(DATA.read_text(encoding="utf-8"))["summary"]
    assert figures == {**summary, "missing_kinds": dict(summary["missing_kinds"])}
    assert figures["exists"] == 113 and figures["checked"] == 99  # the rocm places included (114 places since issue 31)


def test_the_guard_bites_the_old_in_process_resolution():
    _installed_vllm()
    done = _child("""
        from vllm_patchkit.upstream.targets import resolve
        resolve("vllm.platforms.rocm:RocmPlatform.check_and_update_config")
        print("resolved: the guard did not bite")
    """)
    assert done.returncode == -signal.SIGABRT, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "platform-isolation guard: import of vllm.platforms.rocm" in done.stderr
    assert "resolved" not in done.stdout


def test_the_guard_bites_a_plain_import():
    _installed_vllm()
    done = _child("""
        import vllm.platforms.rocm
        print("imported: the guard did not bite")
    """)
    assert done.returncode == -signal.SIGABRT, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "imported" not in done.stdout
