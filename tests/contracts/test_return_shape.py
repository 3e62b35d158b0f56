"""A target's return shape, pinned and judged per patch (issue 30, item 5's misses): vLLM 0.31.0's real
`KVCacheManager.get_computed_blocks` returns `(blocks, hit, boundary)`, and image-publish-admit's wrap unpacks
it; a release returning one element more broke the patch's own tests while `check` said ok (nothing of the
signature changed, and no source digest is pinned for a wrap).

Each release checked is a copy of the installed 0.31.0 tree with one real module rewritten: every tuple the
function's own `return`s build gains an element (as scripts/mutants.py's tuple-arity mutant does), or one of
them only. The loader's verdict is the same comparison (`pinned.compare`) on the live fingerprint of the same
rewritten source.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
import yaml

from tests.contracts.test_reach import _variant, base_tree  # noqa: F401  (the fixture)
from tests.contracts.helpers import patch_doc
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.releases import installed_version
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.upstream.pinned import compare

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="the trees are copies of vLLM 0.31.0")
ROOT = Path(__file__).resolve().parents[2]
KVM = "vllm/v1/core/kv_cache_manager.py"
SCHED = "vllm/v1/core/sched/scheduler.py"
BLOCKS = "vllm.v1.core.kv_cache_manager:KVCacheManager.get_computed_blocks"
FREE = "vllm.v1.core.sched.scheduler:Scheduler._free_request"


def _method(text: str, cls: str, name: str) -> ast.FunctionDef:
    c = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name)


def _grown(text: str, cls: str, name: str, first_only: bool = False) -> str:
    """The module text with ", None" after the last element of each tuple `cls.name`'s own returns build."""
    from vllm_patchkit.upstream.return_shape import own_nodes

    rets = sorted((n for n in own_nodes(_method(text, cls, name)) if isinstance(n, ast.Return)
                   and isinstance(n.value, ast.Tuple)), key=lambda r: r.lineno)
    lines = text.splitlines(keepends=True)
    for r in reversed(rets[:1] if first_only else rets):
        last = r.value.elts[-1]
        i, col = last.end_lineno - 1, last.end_col_offset
        lines[i] = lines[i][:col] + ", None" + lines[i][col:]
    return "".join(lines)


def _check(tree: Path, capsys, *dirs: str) -> tuple[int, dict]:
    code = main(["check", "--source", str(tree), "--vllm", "0.31.0", *dirs, "--format", "json"])
    import json

    return code, json.loads(capsys.readouterr().out)


def _status(doc: dict, key: str) -> str:
    return next(r["status"] for r in doc["patches"] if r["patch"] == key)


def _shape_findings(doc: dict, target: str) -> list[dict]:
    return [b for b in doc["breakages"] if b["kind"] == "return_shape_changed" and b["target"] == target]


def _line(rel: str, text: str) -> int:
    return next(i for i, ln in enumerate((ROOT / rel).read_text().splitlines(), 1) if text in ln)


def _live(tmp_path: Path, text: str, name: str):
    """The module imported from `text` under another name (the live objects of the rewritten source)."""
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(name, None)
    return mod


@pytest.fixture(scope="module")
def shipped():
    return load_patch_set(installed_sources())


@pytest.fixture(scope="module")
def grown_blocks(base_tree, tmp_path_factory):
    """get_computed_blocks returning (blocks, hit, boundary, None) from both its returns."""
    return _variant(base_tree, tmp_path_factory.mktemp("blocks") / "t",
                    {KVM: _grown((base_tree / KVM).read_text(), "KVCacheManager", "get_computed_blocks")})


def test_pin_reads_the_shape_only_when_every_return_says_it(base_tree, tmp_path, capsys):
    """tuple[3] from get_computed_blocks' two returns; one return grown alone: tuples of two lengths, not pinned;
    a function returning a value (allocate_slots: `KVCacheBlocks | None`): not pinned."""
    rel = StaticRelease.open(base_tree)
    assert rel.lookup(BLOCKS).return_shape == "tuple[3]"
    assert rel.lookup(FREE).return_shape == "tuple[2]"
    assert rel.lookup("vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots").return_shape is None
    one = _variant(base_tree, tmp_path / "one", {KVM: _grown((base_tree / KVM).read_text(), "KVCacheManager",
                                                             "get_computed_blocks", first_only=True)})
    assert StaticRelease.open(one).lookup(BLOCKS).return_shape is None
    pdir, mdir = tmp_path / "patches", tmp_path / "manifests"
    pdir.mkdir(), mdir.mkdir()
    (pdir / "p.yaml").write_text(yaml.safe_dump(patch_doc("p", BLOCKS), sort_keys=False))
    for tree, want in ((base_tree, {"return_shape": "tuple[3]"}), (one, {})):
        assert main(["pin", "--source", str(tree), "--vllm", "0.31.0", "--patch-dir", str(pdir),
                     "--manifest-dir", str(mdir)]) == 0, capsys.readouterr()
        pin = yaml.safe_load((mdir / "vllm-0.31.0.yaml").read_text())["patches"][0]["targets"][BLOCKS]
        assert {k: v for k, v in pin.items() if k == "return_shape"} == want, pin
    capsys.readouterr()


def test_a_wrap_that_unpacks_the_result_is_broken_by_a_grown_tuple(grown_blocks, shipped, tmp_path, capsys):
    """image-publish-admit unpacks `result` into three names: check names the arities and the line; the loader's
    comparison of the live function from the same source refuses it in the same words."""
    code, doc = _check(grown_blocks, capsys)
    assert code == 1 and _status(doc, "image-publish-admit@1") == "broken"
    [b] = _shape_findings(doc, BLOCKS)
    line = _line("patches/image_publish_admit.py", "blocks, hit, shared_prefix_boundary = result")
    assert b["explain"] == (f"{BLOCKS}: return shape changed: it returned a tuple of 3 (tuple[3]), now a tuple of "
                            "4 (tuple[4])")
    assert b["breaking"] and b["compat"] == (
        "the implementation patchkit_deepseek_v4.image_publish_admit:get_computed_blocks unpacks it into 3 names "
        f"(patches/image_publish_admit.py:{line}), and wrapped(...) now returns a tuple of 4")
    # the loader: the pin against the live function of the rewritten module
    mod = _live(tmp_path, (grown_blocks / KVM).read_text(), "grown_kv_cache_manager")
    live = fp.live(mod.KVCacheManager.__dict__["get_computed_blocks"], True)
    pin = Fingerprint(kind="method", signature="(self, request)", return_shape="tuple[3]")
    assert live.return_shape == "tuple[4]" and live.signature == pin.signature
    found = compare(BLOCKS, pin, live, patch=shipped.patches["image-publish-admit@1"])
    assert isinstance(found, Finding) and found.code == "fingerprint"
    assert found.reason == f"{b['explain']} (breaking: {b['compat']})"


def test_a_replace_is_broken_by_a_grown_tuple(grown_blocks, base_tree, tmp_path, capsys, monkeypatch):
    """A replace stands in the target's place: vLLM's callers take the new shape from it."""
    pkg = tmp_path / "src" / "shape_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "impl.py").write_text(textwrap.dedent("""\
        def get_computed_blocks(self, request):
            return self.empty_kv_cache_blocks, 0, 0
        """))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    pdir, mdir = tmp_path / "patches", tmp_path / "manifests"
    pdir.mkdir(), mdir.mkdir()
    (pdir / "r.yaml").write_text(yaml.safe_dump(patch_doc(
        "no-prefix-hits", BLOCKS, kind="replace", implementation="shape_plugin.impl:get_computed_blocks"),
        sort_keys=False))
    dirs = ("--patch-dir", str(pdir), "--manifest-dir", str(mdir))
    assert main(["pin", "--source", str(base_tree), "--vllm", "0.31.0", *dirs]) == 0
    capsys.readouterr()
    code, doc = _check(grown_blocks, capsys, *dirs)
    assert code == 1 and _status(doc, "no-prefix-hits@1") == "broken"
    [b] = _shape_findings(doc, BLOCKS)
    assert b["breaking"] and b["compat"] == ("a replace stands in the target's place (shape_plugin/impl.py:1): "
                                             "vLLM's callers now take a tuple of 4 from it")
    assert any(x["kind"] == "source_changed" for x in doc["breakages"])  # its source digest says so too


def test_a_passthrough_survives_a_grown_tuple_and_is_applied(grown_blocks, base_tree, shipped, tmp_path, capsys):
    """A verbatim wrap and a wrap that returns the result as it is (image-publish-finish on `_free_request`) hand
    vLLM's result back untouched: compatible, not stale (the loader judges the shape and applies the patch)."""
    pdir, mdir = tmp_path / "patches", tmp_path / "manifests"
    pdir.mkdir(), mdir.mkdir()
    (pdir / "w.yaml").write_text(yaml.safe_dump(patch_doc("count-lookups", BLOCKS), sort_keys=False))
    dirs = ("--patch-dir", str(pdir), "--manifest-dir", str(mdir))
    assert main(["pin", "--source", str(base_tree), "--vllm", "0.31.0", *dirs]) == 0
    capsys.readouterr()
    code, doc = _check(grown_blocks, capsys, *dirs)
    assert code == 0 and _status(doc, "count-lookups@1") == "compatible", doc
    [b] = _shape_findings(doc, BLOCKS)
    assert not b["breaking"] and b["compat"] == "verbatim passthrough: vLLM's result reaches its caller untouched"

    freed = _variant(base_tree, tmp_path / "freed", {SCHED: _grown((base_tree / SCHED).read_text(), "Scheduler",
                                                                   "_free_request")})
    code, doc = _check(freed, capsys)
    assert code == 0 and _status(doc, "image-publish-finish@1") == "compatible", doc
    [b] = _shape_findings(doc, FREE)
    line = _line("patches/image_publish_finish.py", "return wrapped(*args, **kwargs)")
    assert not b["breaking"] and b["compat"] == (
        "the implementation patchkit_deepseek_v4.image_publish_finish:free_request returns it as it is "
        f"(patches/image_publish_finish.py:{line}): its shape is not the patch's concern")
    mod = _live(tmp_path, (freed / SCHED).read_text(), "freed_scheduler")
    live = fp.live(mod.Scheduler.__dict__["_free_request"], True)
    pin = msgspec.structs.replace(live, return_shape="tuple[2]")
    assert live.return_shape == "tuple[3]"
    assert compare(FREE, pin, live, patch=shipped.patches["image-publish-finish@1"]) is None  # applied


def test_an_element_read_by_index_survives_and_a_uses_entry_unpacked_breaks(shipped, tmp_path, monkeypatch):
    """batch-dispatch-override reads only `result[0]` of the runner's grown 5-tuple (and returns it as it is):
    compatible, saying that the element's meaning is taken, not read; an implementation unpacking what a `uses:`
    entry returns (`ctx.use("get_computed_blocks")(...)`) breaks, at its line."""
    from vllm_patchkit.declaration.validation import validate
    from vllm_patchkit.declaration.schema import Patch
    from vllm_patchkit.upstream.compat import judge
    from vllm_patchkit.upstream.findings import Breakage, BreakageKind

    target = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"
    grown = Breakage(BreakageKind.return_shape_changed, "batch-dispatch-override@1", target, old="tuple[5]",
                     new="tuple[6]")
    b = judge(shipped.patches["batch-dispatch-override@1"], grown)
    src = (ROOT / "patches/batch_dispatch_override.py").read_text().splitlines()
    lines = [i for i, ln in enumerate(src, 1) if "return wrapped(" in ln or "result[0]" in ln or "return result" in ln]
    assert not b.breaking and b.compat == (
        "the implementation patchkit_deepseek_v4.batch_dispatch_override:determine_batch_execution_and_padding "
        f"returns it as it is and reads element 0 of it (patches/batch_dispatch_override.py:{', '.join(map(str, lines))}"
        "), which a tuple of 6 still has (only the arity is pinned: that the element keeps its meaning is taken, not "
        "read)")
    assert judge(shipped.patches["batch-dispatch-override@1"], grown._replace(new="tuple[0]")).breaking

    pkg = tmp_path / "src" / "uses_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "impl.py").write_text(textwrap.dedent("""\
        def schedule(wrapped, instance, args, kwargs, ctx):
            lookup = ctx.use("get_computed_blocks")
            blocks, hit, boundary = lookup(instance.kv_cache_manager, args[0])
            return wrapped(*args, **kwargs)
        """))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    patch = validate(Patch, patch_doc("uses-lookup", "vllm.v1.core.sched.scheduler:Scheduler.schedule",
                                      implementation="uses_plugin.impl:schedule", uses=[BLOCKS]))
    b = judge(patch, Breakage(BreakageKind.return_shape_changed, patch.key, BLOCKS, old="tuple[3]", new="tuple[4]"))
    assert b.breaking and b.compat == ("the implementation's module uses_plugin.impl unpacks it into 3 names "
                                       "(uses_plugin/impl.py:3), and get_computed_blocks(...) now returns a tuple of 4")
