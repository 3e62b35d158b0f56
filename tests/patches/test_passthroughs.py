"""Convention-preserving passthroughs: pool-bytes-passthrough and postprocess-sampled-passthrough.

Each is applied by the framework (shipped patch set and manifest) and then
called the ways vLLM 0.31 calls it: positionally, by keyword, with defaults
omitted, and — for the V2 runner's `postprocess_sampled` — the
pipeline-parallel `**outputs` call of `update_pp_decode_requests`, which omits
`query_start_loc`. What must hold: the upstream function receives exactly what
the caller passed, the result is upstream's, and every call is counted.

`_pool_bytes_per_block` runs for real, alone and inside vLLM's real
`get_kv_cache_configs` (EngineCore's KV sizing), on a real VllmConfig.

The V2 runner cannot run on this CPU (its kernels need Triton), so for
`postprocess_sampled` the upstream method body runs on an instance made with
`object.__new__` and these stand-ins, each documented where it is built:
`post_update` (a Triton kernel launcher) is replaced in the runner module by a
recorder of its arguments, and the state objects the body reads are plain
namespaces. The V2 runner is selected for the config stage with
`VLLM_USE_V2_MODEL_RUNNER=1`, which vLLM's own `use_v2_model_runner` reads live.
"""

from __future__ import annotations

import ast
import copy
import inspect
import textwrap
import types
from pathlib import Path

import pytest

from tests.conftest import process_loader
import torch
import yaml

from vllm_patchkit.runtime import state as runtime
from patchkit_deepseek_v4 import MANIFESTS
from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model
from vllm_patchkit.runtime.loader import Loader
from vllm_patchkit.declaration.manifest import load_manifests
from tests.releases import only_on

ONLY_031 = only_on("0.31.0", "calls _pool_bytes_per_block(kv_cache_groups) in its 0.31 one-parameter form (0.32 added vllm_config)")

POOL = "pool-bytes-passthrough"
POOL_TARGET = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"
POST = "postprocess-sampled-passthrough"
POST_TARGET = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.postprocess_sampled"


@pytest.fixture(scope="module")
def llama_config(tmp_path_factory):
    from vllm.engine.arg_utils import EngineArgs

    ckpt = build_tiny_model(tmp_path_factory.mktemp("ckpt") / "llama")
    return EngineArgs(model=str(ckpt), dtype="float32", max_model_len=512, max_num_seqs=8,
                      enable_prefix_caching=True).create_engine_config()


def _loader(tmp_path, role, cfg=None):
    return process_loader(role, cfg, status_dir=tmp_path / "status")


@pytest.fixture
def engine_core(tmp_path):
    loader = _loader(tmp_path, "engine_core")
    yield loader
    loader.unpatch()
    runtime.reset()


# -- _pool_bytes_per_block ----------------------------------------------------------------------
def kv_specs(block_size):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    return {f"model.layers.{i}.self_attn.attn": spec for i in range(2)}


@ONLY_031
def test_pool_bytes_forwards_positional_and_keyword_and_counts(engine_core, llama_config):
    import vllm.v1.core.kv_cache_utils as kvu

    rec = engine_core.records[POOL]
    assert rec.state == "applied" and rec.stage == "import"
    patched = kvu._pool_bytes_per_block
    upstream = patched.__wrapped__
    assert inspect.signature(patched) == inspect.signature(upstream)  # what introspecting callers see
    groups = kvu.get_kv_cache_groups(llama_config, kv_specs(llama_config.cache_config.block_size))
    expected = upstream(groups)
    assert patched(groups) == expected  # positional, as every caller in vLLM 0.31
    assert patched(kv_cache_groups=groups) == expected  # keyword
    with pytest.raises(TypeError):  # upstream's own arity error, not one of ours
        patched(groups, llama_config)
    engine_core.sync_calls()
    assert rec.calls == 3


def test_pool_bytes_inside_vllms_real_kv_sizing(engine_core, llama_config):
    """EngineCore's call: get_kv_cache_configs reaches the patched function through module globals."""
    import vllm.v1.core.kv_cache_utils as kvu
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

    cfg = copy.deepcopy(llama_config)
    specs = [kv_specs(cfg.cache_config.block_size)]
    # As EngineCore does first: resolve the layout from what the (CPU) worker's backend supports.
    layouts = [[layout.name for layout in get_supported_kv_cache_layouts([CPUAttentionBackend])]]
    resolve_kv_cache_layout(cfg, layouts, [s for w in specs for s in w.values()])
    memory = [64 * 1024 * 1024]
    (patched_cfg,) = kvu.get_kv_cache_configs(cfg, specs, memory)
    engine_core.sync_calls()
    assert engine_core.records[POOL].calls >= 1
    engine_core.unpatch()
    (plain_cfg,) = kvu.get_kv_cache_configs(cfg, specs, memory)
    assert patched_cfg.num_blocks == plain_cfg.num_blocks > 0


def test_pool_bytes_skipped_outside_engine_core(tmp_path):
    loader = _loader(tmp_path, "worker")
    try:
        rec = loader.records[POOL]
        assert (rec.state, rec.code, rec.found) == ("skipped", "process", "worker")
    finally:
        loader.unpatch()
        runtime.reset()


@ONLY_031
def test_changed_arity_is_caught_by_the_pin_not_by_a_crash(tmp_path):
    """A release whose _pool_bytes_per_block took two arguments (as one did): the loader refuses
    to install over it and records expected vs found, instead of the first KV sizing raising."""
    ps = load_patch_set(installed_sources())
    doc = yaml.safe_load((MANIFESTS / "vllm-0.31.0.yaml").read_text())
    (entry,) = [e for e in doc["patches"] if e["patch"] == f"{POOL}@1"]
    entry["targets"][POOL_TARGET]["signature"] = "(kv_cache_groups, vllm_config)"
    doc["patches"] = [entry]
    mdir = tmp_path / "manifests"
    mdir.mkdir()
    (mdir / "vllm-0.31.0.yaml").write_text(yaml.safe_dump(doc))
    loader = Loader(ps, load_manifests([mdir], ps), role="engine_core", status_dir=tmp_path / "status")
    try:  # the observing step counters apply unpinned (this manifest does not list them): undo them
        loader.run_import_stage()
        rec = loader.records[POOL]
        assert (rec.state, rec.code) == ("failed", "fingerprint")
        assert (rec.expected, rec.found) == ("(kv_cache_groups, vllm_config)", "(kv_cache_groups)")
        import vllm.v1.core.kv_cache_utils as kvu

        assert not hasattr(kvu._pool_bytes_per_block, "__vllm_patchkit__")
    finally:
        loader.unpatch()


# -- the V2 runner's postprocess_sampled ----------------------------------------------------------
@pytest.fixture
def v2_worker(tmp_path, llama_config, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert llama_config.use_v2_model_runner is True
    loader = _loader(tmp_path, "worker", llama_config)
    yield loader
    loader.unpatch()
    runtime.reset()


@pytest.fixture
def v2_runner(monkeypatch):
    """A V2 GPUModelRunner whose upstream postprocess_sampled body can run on the CPU.

    Stand-ins: `post_update` launches a Triton kernel (none on this CPU build), so
    the runner module's global is replaced by a recorder of its arguments; the
    request state, sampler and model state the body reads are namespaces.
    """
    import vllm.v1.worker.gpu.model_runner as mr

    seen = []
    monkeypatch.setattr(mr, "post_update", lambda *args: seen.append(args))
    runner = object.__new__(mr.GPUModelRunner)
    gpu = lambda: types.SimpleNamespace(gpu=torch.zeros(4, dtype=torch.int32))  # noqa: E731
    runner.is_last_pp_rank = True
    runner.sampler = types.SimpleNamespace(penalties_state=types.SimpleNamespace(output_bin_counts=None))
    runner.req_states = types.SimpleNamespace(num_computed_tokens=gpu(), last_sampled_tokens=torch.zeros(4),
                                              all_token_ids=gpu(), total_len=gpu(), draft_tokens=None)
    runner.model_state = types.SimpleNamespace(postprocess_state=lambda *a: seen.append(("state", *a)))
    runner.seen = seen
    return runner


def outputs():
    return dict(idx_mapping=torch.tensor([0, 1]), sampled_tokens=torch.tensor([[5], [6]]),
                num_sampled=torch.tensor([1, 1]), num_rejected=torch.tensor([0, 0]))


def _arrived(runner):
    """(sampled_tokens, query_start_loc) as post_update received them, per call."""
    return [(args[4], args[7]) for args in runner.seen if args[0] != "state"]


def test_postprocess_sampled_applied_on_v2_only(v2_worker, tmp_path, llama_config, monkeypatch):
    rec = v2_worker.records[POST]
    assert (rec.state, rec.stage) == ("applied", "config")
    v2_worker.unpatch()
    runtime.reset()
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    v1 = _loader(tmp_path / "v1", "worker", llama_config)
    try:
        rec = v1.records[POST]
        assert (rec.state, rec.code, rec.reason) == ("skipped", "precondition", "runner: expected v2, actual v1")
    finally:
        v1.unpatch()
        runtime.reset()


def test_postprocess_sampled_last_rank_positional_call(v2_worker, v2_runner):
    """execute_model's call: five positional arguments, query_start_loc included."""
    o = outputs()
    qsl = torch.tensor([0, 1, 2])
    assert v2_runner.postprocess_sampled(o["idx_mapping"], o["sampled_tokens"], o["num_sampled"],
                                         o["num_rejected"], qsl) is None
    ((tokens, got_qsl),) = _arrived(v2_runner)
    assert tokens is o["sampled_tokens"] and got_qsl is qsl


def test_postprocess_sampled_keyword_and_omitted_default(v2_worker, v2_runner):
    o = outputs()
    v2_runner.postprocess_sampled(**o, query_start_loc=torch.tensor([0, 1, 2]))
    v2_runner.postprocess_sampled(o["idx_mapping"], o["sampled_tokens"], o["num_sampled"], o["num_rejected"])
    (_, qsl_kw), (_, qsl_omitted) = _arrived(v2_runner)
    assert qsl_kw.tolist() == [0, 1, 2] and qsl_omitted is None
    v2_worker.sync_calls()
    assert v2_worker.records[POST].calls == 2


def pp_output_keys() -> set[str]:
    """The keys vLLM's PPHandler.get_prev_sampled_outputs returns, read from its source."""
    from vllm.v1.worker.gpu.pp_utils import PPHandler

    tree = ast.parse(textwrap.dedent(inspect.getsource(PPHandler.get_prev_sampled_outputs)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "dict"]
    return {kw.arg for call in calls for kw in call.keywords}


def test_postprocess_sampled_pipeline_parallel_outputs_call(v2_worker, v2_runner):
    """A non-last PP rank: vLLM's real update_pp_decode_requests calls postprocess_sampled(**outputs)
    without query_start_loc. The PP handler stands in for vLLM's (it needs CUDA streams and events)
    and returns a dict with exactly the keys vLLM's returns."""
    keys = pp_output_keys()
    assert keys == {"sampled_tokens", "num_sampled", "num_rejected", "idx_mapping"}
    o = {k: v for k, v in outputs().items() if k in keys}
    v2_runner.pp_handler = types.SimpleNamespace(get_prev_sampled_outputs=lambda draft_tokens: o)
    v2_runner.update_pp_decode_requests()
    ((tokens, qsl),) = _arrived(v2_runner)
    assert tokens is o["sampled_tokens"] and qsl is None
    v2_worker.sync_calls()
    assert v2_worker.records[POST].calls == 1


def test_a_renaming_wrapper_would_break_that_call(v2_runner, monkeypatch):
    """Control: the wrapper the seed shipped (sampled_tokens renamed, query_start_loc required)
    raises TypeError on vLLM's PP call — the failure the passthrough and its pin prevent."""
    import vllm.v1.worker.gpu.model_runner as mr

    upstream = mr.GPUModelRunner.__dict__["postprocess_sampled"]

    def seed_wrapper(self, idx_mapping, sampled_token_ids, num_sampled, num_rejected, query_start_loc):
        return upstream(self, idx_mapping, sampled_token_ids, num_sampled, num_rejected, query_start_loc)

    monkeypatch.setattr(mr.GPUModelRunner, "postprocess_sampled", seed_wrapper)
    o = {k: v for k, v in outputs().items() if k in pp_output_keys()}
    v2_runner.pp_handler = types.SimpleNamespace(get_prev_sampled_outputs=lambda draft_tokens: o)
    with pytest.raises(TypeError):
        v2_runner.update_pp_decode_requests()


def test_pins_are_the_upstream_signatures():
    """The manifest pins what vLLM 0.31.0 really has (names, order, defaults)."""
    doc = yaml.safe_load((Path(MANIFESTS) / "vllm-0.31.0.yaml").read_text())
    pins = {t: f for e in doc["patches"] for t, f in e["targets"].items()}
    assert pins[POOL_TARGET]["signature"] == "(kv_cache_groups)"
    assert pins[POST_TARGET]["signature"] == (
        "(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None)")
