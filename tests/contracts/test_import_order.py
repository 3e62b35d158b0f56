"""By-value copies matter only where they can hold the original (issue 31, false-alarm class 1).

An import-stage patch is installed when its target's module executes, so a module that does `from m import f`
later binds the patched `f`. Only a module that may run before the plugins load keeps the original; model modules,
imported lazily by the model registry, never do. Read on vLLM's real releases (installed 0.31.0, the 0.33.0 wheel):
`maybe_prefix`, held by value by ~290 model modules, is held by 15 new ones on 0.33.0; before, a wrap of it pinned
on 0.31.0 was flagged `copy_undeclared ... (breaking)` 15 times on 0.33.0 (and `pin` demanded 286 `copies`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import ReleaseError, installed_static, installed_version, open_release
from vllm_patchkit.upstream.findings import BreakageKind
from vllm_patchkit.upstream.import_order import ImportOrder, order_of
from vllm_patchkit.upstream.static_source import DirSource

from tests.contracts.helpers import patch_doc, write_patches

pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="read against the installed vLLM 0.31.0")
MAYBE_PREFIX = "vllm.model_executor.models.utils:maybe_prefix"
KV_CONFIGS = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"


def _tree(root: Path, files: dict[str, str]) -> DirSource:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return DirSource(root)


def test_the_closure_reads_what_runs_at_import_and_nothing_else(tmp_path):
    src = _tree(tmp_path, {
        "vllm/__init__.py": "import vllm.a\n",
        "vllm/a.py": ("from typing import TYPE_CHECKING\nfrom vllm.b import x\nfrom vllm import h\n"
                      "from vllm.util import load\nhandle = load()\n"
                      "if TYPE_CHECKING:\n    import vllm.d\n"
                      "try:\n    import vllm.e\nexcept ImportError:\n    import vllm.f\n"
                      "class K:\n    import vllm.g\n    def m(self):\n        import vllm.c\n"
                      "def f(\n    a,\n):\n    import vllm.c\n"),
        "vllm/b.py": "x = 1\n", "vllm/c.py": "", "vllm/d.py": "", "vllm/e.py": "", "vllm/f.py": "",
        "vllm/g.py": "", "vllm/h.py": "",
        "vllm/util.py": "def load():\n    import vllm.loaded_by_a_call\n    return 1\n",
        "vllm/loaded_by_a_call.py": "", "vllm/never.py": "",
    })
    before = ImportOrder(src).before_plugins()
    assert before == {"vllm", "vllm.a", "vllm.b", "vllm.e", "vllm.f", "vllm.g", "vllm.h", "vllm.util",
                      "vllm.loaded_by_a_call"}


def test_a_tree_without_vllms_roots_is_unknown_never_after(tmp_path):
    """Nothing is known to run after the plugins in a tree this reading does not know: every holder counts."""
    order = ImportOrder(_tree(tmp_path, {"toy/__init__.py": "", "toy/engine.py": "from toy.core import f\n"}))
    assert order.before_plugins() is None and order.may_run_before_plugins("toy.engine")


def test_the_static_closure_covers_every_module_vllm_imports_before_its_plugins():
    """Soundness, live: a child imports what each role starts from (the CLI, EngineCore, the executors, the
    worker base) and nothing else; every vLLM module then in sys.modules is in the static closure."""
    code = ("import json, sys\nimport vllm.entrypoints.cli.main, vllm.engine.arg_utils, vllm.v1.engine.core, "
            "vllm.v1.executor.multiproc_executor, vllm.v1.worker.worker_base\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    live = set(json.loads(out.stdout.strip().splitlines()[-1]))
    before = order_of(installed_static().release).before_plugins()
    assert len(live) > 100 and live <= before, sorted(live - before)
    assert "vllm.model_executor.models.llama" not in before  # imported by the registry, later


@pytest.fixture(scope="module")
def releases():
    try:
        return installed_static(), open_release("0.33.0")
    except ReleaseError as exc:
        pytest.skip(f"vLLM 0.33.0 cannot be read here ({exc})")


def _patch(tmp_path: Path, target: str, **fields):
    from vllm_patchkit.declaration.declare import load_patch_set

    folder = write_patches(tmp_path / "set", [patch_doc("p", target, **fields)])
    return next(iter(load_patch_set([folder]).patches.values()))


def _undeclared(release, patch) -> list[str]:
    _, judged = examine(release, patch, None)
    return sorted(b.new for b in judged if b.kind is BreakageKind.copy_undeclared)


def test_model_modules_holding_a_wrapped_function_are_no_copies(releases, tmp_path):
    old, new = releases
    assert len(old.holders(MAYBE_PREFIX)) > 200  # the model modules hold it by value
    patch = _patch(tmp_path, MAYBE_PREFIX)
    found, _ = examine(old, patch, None)
    assert _undeclared(old, patch) == []  # pin demands no copies
    added = set(new.holders(MAYBE_PREFIX)) - set(old.holders(MAYBE_PREFIX))
    assert len(added) >= 10  # 0.33.0 adds model modules holding it
    _, judged = examine(new, patch, found, old)
    assert [b for b in judged if b.kind is BreakageKind.copy_undeclared] == []


def test_a_holder_that_runs_before_the_plugins_is_still_a_copy(releases, tmp_path):
    """EngineCore imports get_kv_cache_configs by value and is imported before the plugins load in its process:
    a wrap without `copies` is bypassed there, and says so."""
    old, _ = releases
    assert _undeclared(old, _patch(tmp_path, KV_CONFIGS)) == ["vllm.v1.engine.core:get_kv_cache_configs"]


def test_a_config_stage_patch_counts_every_holder(releases, tmp_path):
    """A patch installed when the config is ready may come after a model module bound the original."""
    old, _ = releases
    patch = _patch(tmp_path, MAYBE_PREFIX, when={"architectures": ["DeepseekV4ForCausalLM"]})
    assert patch.stage == "config"
    assert len(_undeclared(old, patch)) > 200
