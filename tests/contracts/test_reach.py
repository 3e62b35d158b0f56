"""The reach (issue 30): what a patch's implementation reads, calls and imports in vLLM is pinned, and `check` and the
loader refuse a release that no longer defines it.

The release is a copy of the installed vLLM 0.31.0's Python tree (its `vllm/*.py` only) changed in one way each:
`InputBatch.num_prompt_tokens` renamed (its assignments in the class and its readers in vLLM with it, nothing
else), or an unrelated attribute added (harmless). The live side runs the real InputBatch's source, renamed the
same way, as the class the loader finds.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
from vllm_patchkit.declaration.errors import PatchkitError
from vllm_patchkit.declaration.manifest import load_manifests
from vllm_patchkit.declaration.patchsets import discover
from vllm_patchkit.tools import reach_check
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.pin import pin_release
from vllm_patchkit.tools.releases import installed_static, installed_version, open_release
from vllm_patchkit.upstream import reach_live
from vllm_patchkit.upstream.findings import Finding

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="the trees are copies of vLLM 0.31.0")
PATCH = "batch-dispatch-override@1"
INPUT_BATCH = "vllm.v1.worker.gpu_input_batch:InputBatch"
IMPL = Path(__file__).resolve().parents[2] / "patches" / "batch_dispatch_override.py"


def _line_reading(text: str) -> int:
    """The implementation's line that reads `.num_prompt_tokens` (read from the file, never written here)."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if ".num_prompt_tokens" in line)


@pytest.fixture(scope="module")
def base_tree(tmp_path_factory) -> Path:
    """vLLM 0.31.0's `vllm/` Python files, copied (no compiled extension)."""
    src = Path(vllm.__file__).parent
    root = tmp_path_factory.mktemp("vllm031")
    for f in src.rglob("*.py"):
        t = root / "vllm" / f.relative_to(src)
        t.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, t)
    return root


def _variant(base: Path, dest: Path, edits: dict[str, str]) -> Path:
    """`base` hard-linked into `dest`, the files in `edits` (relative paths) written anew (unlinked first)."""
    shutil.copytree(base, dest, copy_function=os.link)
    for rel, text in edits.items():
        (dest / rel).unlink()
        (dest / rel).write_text(text)
    return dest


def _renamed_input_batch(text: str, new: str) -> str:
    """The module text with InputBatch's own `self.num_prompt_tokens` renamed to `self.<new>` (not
    CachedRequestState's attribute of the same name)."""
    lines = text.splitlines(keepends=True)
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "InputBatch")
    for i in range(cls.lineno - 1, cls.end_lineno):
        lines[i] = re.sub(r"\bself\.num_prompt_tokens\b", f"self.{new}", lines[i])
    return "".join(lines)


@pytest.fixture(scope="module")
def renamed_tree(base_tree, tmp_path_factory) -> Path:
    edits = {}
    ib = "vllm/v1/worker/gpu_input_batch.py"
    edits[ib] = _renamed_input_batch((base_tree / ib).read_text(), "num_prompt_tokens_np")
    for f in (base_tree / "vllm").rglob("*.py"):
        text = f.read_text()
        new = re.sub(r"\binput_batch\.num_prompt_tokens\b", "input_batch.num_prompt_tokens_np", text)
        rel = f.relative_to(base_tree).as_posix()
        if new != text:
            edits[rel] = new if rel != ib else edits[ib]
    assert len(edits) > 1, "the rename reached no reader: the tree would not be the case the issue describes"
    return _variant(base_tree, tmp_path_factory.mktemp("renamed") / "t", edits)


def test_check_names_the_renamed_attribute_and_the_line(renamed_tree, capsys):
    assert main(["check", "--source", str(renamed_tree), "--vllm", "0.31.0"]) == 1
    out = capsys.readouterr().out
    line = _line_reading(IMPL.read_text())
    assert f"BROKEN    {PATCH}" in out
    assert (f"[reach_missing] {INPUT_BATCH}.num_prompt_tokens: {PATCH} reads InputBatch.num_prompt_tokens "
            f"(patches/batch_dispatch_override.py:{line}); vLLM 0.31.0 defines no such attribute on InputBatch") in out
    assert " 1 broken," in out  # nothing else in the tree changed


def test_pin_refuses_the_renamed_tree(renamed_tree):
    sources = discover(None)
    ps = load_patch_set(sources)
    manifests = {v: lm.manifest for v, lm in load_manifests(manifest_dirs(sources), ps).items()}
    with pytest.raises(PatchkitError, match=r"batch-dispatch-override@1: .*cannot be pinned: .*num_prompt_tokens"):
        pin_release(open_release("0.31.0", renamed_tree), ps, manifests, generated_by="test")


def test_an_unrelated_new_attribute_is_not_flagged(base_tree, tmp_path, capsys):
    ib = "vllm/v1/worker/gpu_input_batch.py"
    text = (base_tree / ib).read_text()
    added = text.replace("        self.num_prompt_tokens = ", "        self.unrelated_new_attribute = 0\n"
                         "        self.num_prompt_tokens = ", 1)
    assert added != text
    tree = _variant(base_tree, tmp_path / "t", {ib: added})
    assert main(["check", "--source", str(tree), "--vllm", "0.31.0"]) == 0
    out = capsys.readouterr().out
    assert "reach_missing" not in out and f"ok        {PATCH}" in out


# -- the loader, live ------------------------------------------------------------------------------------------
def _entry(key: str):
    sources = discover(None)
    ps = load_patch_set(sources)
    m = load_manifests(manifest_dirs(sources), ps)[installed_version()].manifest
    return ps.patches[key], next(e for e in m.patches if e.patch == key), m


def test_every_pinned_name_is_live_on_the_installed_release():
    """The live rule (bytecode, fields, MRO) agrees with the static one on every name pinned for 0.31.0."""
    _, _, m = _entry(PATCH)
    names = [(e.patch, k, p) for e in m.patches for k, p in e.reach.items()]
    assert len(names) > 20
    assert [(patch, k, reach_live.missing(k, p)) for patch, k, p in names
            if reach_live.missing(k, p) is not None] == []


@pytest.fixture
def renamed_live_class(monkeypatch):
    """vLLM's real InputBatch, its own source renamed as in the tree, executed in its module as the class the
    loader resolves."""
    from vllm.v1.worker import gpu_input_batch

    real = gpu_input_batch.InputBatch
    src = _renamed_input_batch(textwrap.dedent(inspect.getsource(gpu_input_batch)), "num_prompt_tokens_np")
    cls_node = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "InputBatch")
    space = dict(vars(gpu_input_batch))
    exec(compile(ast.Module([cls_node], []), gpu_input_batch.__file__, "exec"), space)
    monkeypatch.setattr(gpu_input_batch, "InputBatch", space["InputBatch"])
    return real, space["InputBatch"]


def test_live_rule_reads_what_the_class_assigns(renamed_live_class):
    real, renamed = renamed_live_class
    assert reach_live.defines(real, "num_prompt_tokens")
    assert not reach_live.defines(renamed, "num_prompt_tokens")
    assert reach_live.defines(renamed, "num_prompt_tokens_np")
    assert reach_live.defines(renamed, "num_computed_tokens_cpu")  # untouched


def test_loader_verify_refuses_a_live_class_missing_the_attribute(renamed_live_class):
    from vllm_patchkit.runtime.verify import verify

    patch, entry, _ = _entry(PATCH)
    got = verify(patch, entry)
    assert isinstance(got, Finding) and got.code == "reach", got
    assert "InputBatch.num_prompt_tokens" in got.reason and got.expected == f"{INPUT_BATCH}.num_prompt_tokens"


def test_loader_verify_passes_the_real_class():
    from vllm_patchkit.runtime.verify import verify

    patch, entry, _ = _entry(PATCH)
    assert entry.reach, "the manifest entry pins no reach"
    assert not isinstance(verify(patch, entry), Finding)


# -- what is resolved ------------------------------------------------------------------------------------------
def test_reach_of_every_shipped_patch_is_resolved_or_listed(capsys):
    """Each name an implementation reaches is followed (and defined on 0.31.0) or listed as not followed; the
    manifest for 0.31.0 pins exactly the followed ones."""
    release = installed_static()
    ps = load_patch_set(discover(None))
    m = _entry(PATCH)[2]
    followed = total = 0
    lines = []
    for e in m.patches:
        patch = ps.patches[e.patch]
        items = reach_check.read(release, patch)
        f, t = reach_check.resolved(items)
        followed, total = followed + f, total + t
        assert all(i.member is not None for i in items if i.followed), e.patch
        assert reach_check.pins(items) == dict(e.reach), f"{e.patch}: the manifest's reach is not current: re-pin"
        lines += [f"  {e.patch}: {f}/{t} followed"] + [f"    not followed: {i.owner} .{i.name} "
                                                        f"({reach_check.reach.where(i, reach_check.root_of(ps, e.patch))})"
                                                        for i in items if not i.followed]
    assert total and followed < total  # some names are not followed, and they are listed, not dropped
    with capsys.disabled():
        print(f"\nreach on vLLM 0.31.0: {followed}/{total} names followed ({followed / total:.0%})")
        print("\n".join(lines))


#: the modules whose classes the shipped set reaches into (and a few more): every class defined in them
AGREEMENT_MODULES = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu_input_batch", "vllm.v1.worker.gpu.model_runner",
                     "vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.output", "vllm.v1.core.kv_cache_manager",
                     "vllm.v1.core.single_type_kv_cache_manager", "vllm.v1.core.block_pool",
                     "vllm.v1.core.kv_cache_coordinator", "vllm.v1.request", "vllm.v1.kv_cache_interface",
                     "vllm.config.model", "vllm.config.cache")


def test_live_and_static_read_the_same_assignments_on_self():
    """One rule, two readers: what the loader reads from each real class's bytecode is what pin and check read from
    its source (`static_tables.instance_assignments`), attribute for attribute, for every class of those modules
    (BlockPool's `self` is a cell, captured by a closure; a dataclass's generated `__init__` is not counted)."""
    import importlib

    from vllm_patchkit.upstream.static_tables import instance_assignments

    compared, differ = 0, []
    for module in AGREEMENT_MODULES:
        mod = importlib.import_module(module)
        for node in ast.parse(inspect.getsource(mod)).body:
            cls = getattr(mod, getattr(node, "name", ""), None)
            if not (isinstance(node, ast.ClassDef) and isinstance(cls, type) and cls.__module__ == module):
                continue
            compared += 1
            static, live = set(instance_assignments(node)), reach_live.assigned_on_self(cls)
            if static != live:
                differ.append((f"{module}:{node.name}", sorted(static - live), sorted(live - static)))
    assert compared > 50 and differ == []


def test_a_pinned_name_on_a_class_the_release_no_longer_has_is_missing():
    """A name the entry pinned, on a class the release does not define, is reported (never taken as 'outside')."""
    import msgspec

    from vllm_patchkit.declaration.pins import ReachPin

    patch, entry, _ = _entry(PATCH)
    gone = "vllm.v1.worker.gpu_input_batch:NoSuchBatch.num_prompt_tokens"
    entry = msgspec.structs.replace(entry, reach={**entry.reach, gone: ReachPin(kind="attribute")})
    found = reach_check.breakages(installed_static(), patch, entry)
    assert [b.target for b in found] == [gone]
    assert "pinned in the manifest entry" in found[0].explain()
    assert reach_live.missing(gone, ReachPin(kind="attribute")) is not None


def test_the_v2_override_reaches_into_the_state_the_target_returns(base_tree, tmp_path, capsys):
    """The V2 override unpacks `state, count = wrapped(...)` and reads `state.decode_graph_eligible`: the target's
    return annotation (`tuple["BatchReqState | None", int | None]`) types `state`, so the field is pinned, and a
    tree where BatchReqState's field is renamed (its readers untouched: mutation acceptance's last reach miss) is
    broken naming it. `_replace` comes from NamedTuple: not followed, never missing."""
    runner = "vllm/v1/worker/gpu/model_runner.py"
    text = (base_tree / runner).read_text()
    assert "    decode_graph_eligible: bool" in text
    renamed = _variant(base_tree, tmp_path / "t", {runner: text.replace("    decode_graph_eligible: bool",
                                                                       "    decode_graph_ok: bool", 1)})
    assert main(["check", "--source", str(renamed), "--vllm", "0.31.0"]) == 1
    out = capsys.readouterr().out
    assert "BROKEN    batch-dispatch-override-v2@1" in out
    assert ("[reach_missing] vllm.v1.worker.gpu.model_runner:BatchReqState.decode_graph_eligible: "
            "batch-dispatch-override-v2@1 reads BatchReqState.decode_graph_eligible") in out
    assert "_replace" not in out
