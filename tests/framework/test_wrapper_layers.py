"""Wrapper layers and replacements the pin does not account for are someone else's (verify, conflict).

- A layer whose code lives in a dependency of vLLM (another plugin wrapping a target with
  `torch.no_grad()`, or the stdlib's `functools.lru_cache`) that was not there when the
  target was pinned is a conflict; one the pin has (vLLM's own `@torch.inference_mode()`)
  is not.
- Upstream's own optional decorator layers (code inside vLLM: `@instrument`, present only
  when OpenTelemetry imports) are tolerated either way; `tests/framework/test_loader.py` keeps
  the regression test for a pin taken without the layer.
- A replacement with the same signature whose `__module__`/`__qualname__` were made to
  look like the original's is found by its code: file and first line.
"""

from __future__ import annotations

import functools
import sys
import textwrap

import pytest
import torch

from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream import wrapper_layers as layers

from .helpers import live_pin, make_loader, patch_doc, pinned_entry

KV = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
POOL = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"
EXEC_MODEL = "vllm.v1.worker.gpu_worker:Worker.execute_model"
EXEC_INIT = "vllm.v1.executor.abstract:Executor.__init__"

pytestmark = pytest.mark.usefixtures("undo_every_loader")




@pytest.fixture
def kvu():
    import vllm.v1.core.kv_cache_utils as kvu

    saved = (kvu.get_kv_cache_configs, kvu._pool_bytes_per_block)
    yield kvu
    kvu.get_kv_cache_configs, kvu._pool_bytes_per_block = saved


@pytest.fixture
def worker():
    import vllm.v1.worker.gpu_worker as gw

    saved = gw.Worker.__dict__["execute_model"]
    yield gw
    gw.Worker.execute_model = saved


@pytest.fixture
def executor():
    import vllm.v1.executor.abstract as ex

    saved = ex.Executor.__dict__["__init__"]
    yield ex
    ex.Executor.__init__ = saved


def run(tmp_path, spec, entry=None):
    doc = patch_doc(id="p", kind="wrap", target=spec, processes=["frontend"])
    loader = make_loader(tmp_path, {"p": doc}, [entry or pinned_entry("p@1", spec)])
    loader.run_import_stage()
    return loader, loader.records["p"]


# -- layers with code in a dependency --------------------------------------------------------------
def test_torch_no_grad_layer_added_by_another_plugin_is_a_conflict(tmp_path, kvu):
    entry = pinned_entry("p@1", KV)  # pinned as vLLM ships it: no layer
    upstream = kvu.get_kv_cache_configs
    other_plugin = torch.no_grad()(upstream)  # code in torch, a dependency of vLLM
    kvu.get_kv_cache_configs = other_plugin
    loader, rec = run(tmp_path, KV, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.reason == (f"{KV} carries a wrapper layer that was not there when it was pinned (its code is in a "
                          "dependency of the upstream package, but the pin does not have it): someone else wrapped "
                          "it; refusing to stack on it")
    assert rec.expected == []
    assert len(rec.found) == 1 and "torch" in rec.found[0] and "_contextlib.py" in rec.found[0]
    assert kvu.get_kv_cache_configs is other_plugin  # never stacked on


def test_stdlib_cache_layer_added_after_pinning_is_a_conflict(tmp_path, kvu):
    entry = pinned_entry("p@1", POOL)
    cached = functools.lru_cache(maxsize=None)(kvu._pool_bytes_per_block)
    kvu._pool_bytes_per_block = cached
    _, rec = run(tmp_path, POOL, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.found == ["functools._lru_cache_wrapper"]
    assert kvu._pool_bytes_per_block is cached


def test_a_dependency_layer_applies_only_when_the_pin_has_it(tmp_path, worker):
    """Worker.execute_model carries vLLM's @torch.inference_mode(): code in torch, and in the pin."""
    assert live_pin(EXEC_MODEL)["wrappers"] == ["vllm.v1.worker.gpu_worker.Worker.execute_model"]
    loader, rec = run(tmp_path / "pinned", EXEC_MODEL)
    try:
        assert rec.state == "applied", rec
    finally:
        loader.unpatch()
    entry = pinned_entry("p@1", EXEC_MODEL)
    entry["targets"][EXEC_MODEL]["wrappers"] = []  # a pin that does not have it: someone else's layer
    _, rec = run(tmp_path / "unpinned", EXEC_MODEL, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")


def test_a_second_dependency_layer_on_top_of_upstreams_own_is_a_conflict(tmp_path, worker):
    entry = pinned_entry("p@1", EXEC_MODEL)
    stacked = torch.no_grad()(worker.Worker.__dict__["execute_model"])
    worker.Worker.execute_model = stacked
    _, rec = run(tmp_path, EXEC_MODEL, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.expected == ["vllm.v1.worker.gpu_worker.Worker.execute_model"]
    assert len(rec.found) == 1  # the added one; upstream's own stays accounted for by the pin
    assert worker.Worker.__dict__["execute_model"] is stacked


def test_unpinned_layers_counts_each_pinned_name_once():
    def f(x):
        return x

    once = torch.no_grad()(f)
    twice = torch.no_grad()(once)
    name = f"{f.__module__}.{f.__qualname__}"
    assert layers.unpinned_layers(once, "vllm.x", [name]) == []
    assert len(layers.unpinned_layers(twice, "vllm.x", [name])) == 1
    assert len(layers.unpinned_layers(twice, "vllm.x", [])) == 2
    assert layers.unpinned_layers(twice, "vllm.x", [name, name]) == []


# -- upstream's own optional layers ---------------------------------------------------------------
def test_a_layer_not_in_the_pin_is_tolerated_only_when_its_code_is_vllms(tmp_path, kvu):
    """Code inside vLLM (its @instrument wrapper) is upstream's, pinned or not; torch's is not."""
    from vllm.tracing import instrument

    entry = pinned_entry("p@1", KV)
    upstream = kvu.get_kv_cache_configs
    instrumented = instrument(span_name="kv sizing")(upstream)
    assert hasattr(instrumented, "__wrapped__"), "OpenTelemetry is installed with vLLM here: @instrument wraps"
    kvu.get_kv_cache_configs = instrumented
    loader, rec = run(tmp_path / "vllm", KV, entry)
    try:
        assert rec.state == "applied", rec
    finally:
        loader.unpatch()
    kvu.get_kv_cache_configs = torch.inference_mode()(upstream)
    _, rec = run(tmp_path / "torch", KV, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")


def test_an_upstream_layer_pinned_but_absent_here_is_tolerated(tmp_path, executor):
    """Executor.__init__ pinned with its @instrument layer, run where OpenTelemetry is missing."""
    entry = pinned_entry("p@1", EXEC_INIT)
    assert entry["targets"][EXEC_INIT]["wrappers"] == ["vllm.v1.executor.abstract.Executor.__init__"]
    executor.Executor.__init__ = executor.Executor.__dict__["__init__"].__wrapped__  # as without the layer
    loader, rec = run(tmp_path, EXEC_INIT, entry)
    try:
        assert rec.state == "applied", rec
    finally:
        loader.unpatch()


# -- replacements that look like the original -----------------------------------------------------
def _faked(tmp_path, monkeypatch, kvu):
    import inspect

    params = ", ".join(inspect.signature(kvu._pool_bytes_per_block).parameters)  # the installed release's
    (tmp_path / "impostor.py").write_text(f"def _pool_bytes_per_block({params}):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "impostor", raising=False)
    import impostor

    fake = impostor._pool_bytes_per_block
    fake.__module__ = kvu._pool_bytes_per_block.__module__
    fake.__qualname__ = kvu._pool_bytes_per_block.__qualname__
    return fake


def test_replacement_with_faked_module_and_qualname_is_a_conflict(tmp_path, monkeypatch, kvu):
    entry = pinned_entry("p@1", POOL)
    fake = _faked(tmp_path, monkeypatch, kvu)
    kvu._pool_bytes_per_block = fake
    assert fp.live(fake, False).signature == entry["targets"][POOL]["signature"]  # same signature
    _, rec = run(tmp_path / "run", POOL, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")
    # its code is outside vLLM: named by file and line (and distribution) whatever its names claim (issue 21)
    site = (f"vllm.v1.core.kv_cache_utils:_pool_bytes_per_block at {tmp_path / 'impostor.py'}:1 "
            "(in no installed distribution)")
    assert rec.reason.startswith(f"{POOL} was replaced by code outside vLLM: {site}; ")
    assert rec.found == site
    assert kvu._pool_bytes_per_block is fake


def test_replacement_made_from_another_def_of_the_same_file_is_a_conflict(tmp_path, monkeypatch):
    """Module, qualname and file all look right; the code starts at another def (same signature)."""
    import types

    (tmp_path / "layers_toy.py").write_text(textwrap.dedent("""
        def size(groups):
            return 1

        def other_size(groups):
            return 2
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "layers_toy", raising=False)
    import layers_toy

    spec = "layers_toy:size"
    entry = pinned_entry("p@1", spec)
    fake = types.FunctionType(layers_toy.other_size.__code__, layers_toy.__dict__, "size")
    fake.__qualname__ = "size"
    monkeypatch.setattr(layers_toy, "size", fake)
    assert fp.live(fake, False).signature == entry["targets"][spec]["signature"]
    _, rec = run(tmp_path / "run", spec, entry)
    assert (rec.state, rec.code) == ("failed", "conflict")
    assert rec.found == (f"layers_toy:size (code at {layers_toy.__file__}:5, which is not the def of size)")
    assert layers_toy.size is fake
    sys.modules.pop("layers_toy", None)


def test_dataclass_generated_methods_are_upstreams_own(tmp_path):
    """A dataclass's __init__ is generated code (file '<string>'): still upstream's, not a replacement."""
    import vllm.v1.kv_cache_interface as kci

    spec = "vllm.v1.kv_cache_interface:FullAttentionSpec.__init__"
    assert kci.FullAttentionSpec.__dict__["__init__"].__code__.co_filename.startswith("<")
    before = kci.FullAttentionSpec.__dict__["__init__"]
    loader, rec = run(tmp_path, spec)
    try:
        assert rec.state == "applied", rec
    finally:
        loader.unpatch()
    assert kci.FullAttentionSpec.__dict__["__init__"] is before
