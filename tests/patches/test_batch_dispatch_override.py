"""batch-dispatch-override on vLLM's real V1 runner, input batch and cudagraph dispatcher (CPU).

What is real: the patch is applied by the framework (the shipped patch set and
manifest, `Loader(role="worker")`, import stage then config stage on a
VllmConfig that vLLM's own EngineArgs built from a tiny local checkpoint); the
runner is a fully constructed `CPUModelRunner` (a `GPUModelRunner` subclass
that does not override the patched method); rows are added to its real
`InputBatch` with `CachedRequestState`, as `_update_states` does; every call is
vLLM's real `_determine_batch_execution_and_padding`, made with the keywords
`execute_model` uses (or, for capture, with `_dummy_run`'s bool).

What stands in, and why:
- The architecture `DeepseekV4ForCausalLM` is served by the test-only
  out-of-tree class `patchkit_standin.model:StandinDeepseekV4ForCausalLM` (a
  thin subclass of vLLM's Llama), registered in-process as the stand-in plugin
  does: ATOM's model cannot run here, and the patch looks only at the
  architecture name and at which class serves it.
- The CPU platform turns CUDA graphs off, so the runner's dispatcher would
  answer NONE for every step. Each runner therefore gets vLLM's real
  `CudagraphDispatcher` initialised as on a GPU (FULL_AND_PIECEWISE, capture
  sizes 1..16): FULL is the decode graph a still-prefilling row must never
  replay, PIECEWISE the mixed-batch graph.
- No model weights are loaded (the patch never reads them); one test sets
  `runner.model` to an uninitialised instance of vLLM's own Llama to show the
  decision follows the loaded class.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from tests.patches.process_groups import single_rank

from tests.conftest import applied_in, process_loader

from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model
from vllm_patchkit.reporting.run_folder import load_run

ARCH = "DeepseekV4ForCausalLM"
STANDIN = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"
PATCH_ID = "batch-dispatch-override"
TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"


# -- real vLLM objects ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def standin():
    """The out-of-tree class for DeepseekV4ForCausalLM, registered for this module only."""
    from vllm import ModelRegistry

    saved = ModelRegistry.models.get(ARCH)
    ModelRegistry.register_model(ARCH, STANDIN)
    yield
    if saved is None:
        ModelRegistry.models.pop(ARCH, None)
    else:
        ModelRegistry.models[ARCH] = saved


def _build_config(model_dir, **kw):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model_dir), dtype="float32", max_model_len=512, max_num_seqs=8,
                      enable_prefix_caching=True, **kw).create_engine_config()


@pytest.fixture(scope="module")
def configs(tmp_path_factory, standin):
    """Real VllmConfigs: the stand-in V4 (with and without one speculative token) and a plain Llama.

    VLLM_USE_BREAKABLE_CUDAGRAPH is held at 0 while they are built: for V4 names vLLM
    otherwise sets it to 1 in os.environ, for the whole test session.
    """
    base = tmp_path_factory.mktemp("ckpt")
    v4 = build_tiny_model(base / "v4", architecture=ARCH)
    llama = build_tiny_model(base / "llama", architecture="LlamaForCausalLM")
    ngram = {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
        return {"v4": _build_config(v4), "v4_spec": _build_config(v4, speculative_config=ngram),
                "llama": _build_config(llama)}


@pytest.fixture(scope="module")
def distributed(configs):
    """vLLM's process groups for one rank (gloo): a runner with a speculative config asks for the PP group."""
    with single_rank(configs["v4_spec"]):
        yield


def gpu_like_dispatcher(runner):
    """vLLM's real dispatcher for this runner, initialised as on a GPU with FULL_AND_PIECEWISE graphs."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    dispatcher = CudagraphDispatcher(runner.vllm_config)
    cc = copy.copy(runner.vllm_config.compilation_config)
    cc.cudagraph_capture_sizes = [1, 2, 4, 8, 16]
    cc.max_cudagraph_capture_size = 16
    cc.compile_sizes = []
    dispatcher.compilation_config = cc
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.FULL_AND_PIECEWISE, runner.uniform_decode_query_len)
    return dispatcher


def make_runner(cfg):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    with set_current_vllm_config(cfg):
        runner = CPUModelRunner(cfg, torch.device("cpu"))
    runner.cudagraph_dispatcher = gpu_like_dispatcher(runner)
    return runner


def add_row(runner, req_id, prompt_len, computed, output=()):
    """One request in the runner's InputBatch, as `_update_states` adds it."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    runner.input_batch.add_request(CachedRequestState(
        req_id=req_id, prompt_token_ids=[(7 * i) % 300 + 3 for i in range(prompt_len)], mm_features=[],
        sampling_params=SamplingParams(temperature=0.0), generator=None, block_ids=([1, 2],),
        num_computed_tokens=computed, output_token_ids=list(output)))


def step_kwargs(runner, scheduled):
    """The keywords GPUModelRunner.execute_model passes for a step scheduling `scheduled` tokens per row."""
    num_scheduled = np.array(scheduled, dtype=np.int32)
    return dict(num_tokens=int(num_scheduled.sum()), num_reqs=runner.input_batch.num_reqs,
                num_scheduled_tokens_np=num_scheduled, max_num_scheduled_tokens=int(num_scheduled.max()),
                use_cascade_attn=False, num_encoder_reqs=0, allow_microbatching=True)


def step(runner, scheduled):
    """(mode vLLM alone dispatches, mode dispatched through the patch) for one real step."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    upstream = GPUModelRunner.__dict__["_determine_batch_execution_and_padding"].__wrapped__
    before = upstream(runner, **step_kwargs(runner, scheduled))[0].name
    after = runner._determine_batch_execution_and_padding(**step_kwargs(runner, scheduled))[0].name
    return before, after


def counts(loader):
    """The patch's counts as its record holds them after the loader's sync (what a flush writes)."""
    loader.sync_calls()
    d = loader.records[PATCH_ID].detail
    return {k: d.get(k) for k in ("steps_seen", "steps_overridden", "steps_overridden_decode_shaped",
                                  "cudagraph_modes")}


# -- the patch applied by the framework ----------------------------------------------------------
def _worker_loader(tmp_path, cfg):
    return process_loader("worker", cfg, status_dir=tmp_path / "status")


@pytest.fixture
def loader(tmp_path, configs):
    """The shipped patch set in a worker, config stage judged on the stand-in V4's VllmConfig."""
    with applied_in("worker", configs["v4"], PATCH_ID, tmp_path / "status") as ldr:
        yield ldr


@pytest.fixture
def v4_runner(configs, loader):
    return make_runner(configs["v4"])


def test_applied_in_worker_on_plugin_v4_only(loader):
    rec = loader.records[PATCH_ID]
    assert rec.stage == "config"
    assert rec.detail["places"] == [TARGET]
    assert not [f for f in rec.findings if f["code"] == "shadowed"], rec.findings  # CPUModelRunner inherits it


def test_skipped_for_llama_with_the_architecture_as_reason(tmp_path, configs):
    ldr = _worker_loader(tmp_path, configs["llama"])
    try:
        rec = ldr.records[PATCH_ID]
        assert (rec.state, rec.code) == ("skipped", "precondition")
        assert rec.expected == [ARCH] and rec.found == ["LlamaForCausalLM"]
        assert rec.reason.startswith("architectures:")
    finally:
        ldr.unpatch()
        runtime.reset()


def test_one_token_tail_after_prefix_hit(v4_runner, loader):
    """129-token prompt, 128 tokens hit in the prefix cache: one prompt token left, scheduled alone."""
    add_row(v4_runner, "tail", prompt_len=129, computed=128)
    assert step(v4_runner, [1]) == ("FULL", "PIECEWISE")
    assert counts(loader) == {"steps_seen": 1, "steps_overridden": 1, "steps_overridden_decode_shaped": 1,
                              "cudagraph_modes": {"PIECEWISE": 1}}


def test_one_token_prompt(v4_runner, loader):
    add_row(v4_runner, "tiny", prompt_len=1, computed=0)
    assert step(v4_runner, [1]) == ("FULL", "PIECEWISE")


def test_mixed_batch_with_decodes(v4_runner, loader):
    """Two decodes and a 1-token tail look like a 3-row decode batch; a longer chunk beside decodes
    is mixed by shape already (overridden, same mode)."""
    add_row(v4_runner, "d1", prompt_len=20, computed=21, output=[5, 6])
    add_row(v4_runner, "d2", prompt_len=33, computed=33, output=[9])
    add_row(v4_runner, "tail", prompt_len=129, computed=128)
    assert step(v4_runner, [1, 1, 1]) == ("FULL", "PIECEWISE")
    v4_runner.input_batch.num_computed_tokens_cpu[2] = 119  # same row, now a 10-token chunk
    assert step(v4_runner, [1, 1, 10]) == ("PIECEWISE", "PIECEWISE")
    assert counts(loader) == {"steps_seen": 2, "steps_overridden": 2, "steps_overridden_decode_shaped": 1,
                              "cudagraph_modes": {"PIECEWISE": 2}}


def test_two_token_tail_with_one_speculative_token(configs, distributed, tmp_path):
    """With one speculative token the decode query length is 2, so a 2-token tail is decode-shaped;
    a real speculative decode (1 + 1 draft) keeps the FULL graph."""
    ldr = _worker_loader(tmp_path, configs["v4_spec"])
    try:
        runner = make_runner(configs["v4_spec"])
        assert runner.uniform_decode_query_len == 2
        add_row(runner, "tail", prompt_len=129, computed=127)
        assert step(runner, [2]) == ("FULL", "PIECEWISE")
        runner.input_batch.num_computed_tokens_cpu[0] = 130  # the same request, decoding with a draft token
        assert step(runner, [2]) == ("FULL", "FULL")
        assert counts(ldr) == {"steps_seen": 2, "steps_overridden": 1, "steps_overridden_decode_shaped": 1,
                               "cudagraph_modes": {"PIECEWISE": 1, "FULL": 1}}
    finally:
        ldr.unpatch()
        runtime.reset()


def test_pure_decode_unchanged(v4_runner, loader):
    for i in range(4):
        add_row(v4_runner, f"d{i}", prompt_len=10 + i, computed=12 + i, output=[1, 2, 3])
    assert step(v4_runner, [1, 1, 1, 1]) == ("FULL", "FULL")
    assert counts(loader) == {"steps_seen": 1, "steps_overridden": 0, "steps_overridden_decode_shaped": 0,
                              "cudagraph_modes": {"FULL": 1}}


def test_first_decode_after_the_prompt(v4_runner, loader):
    """The prompt's 129 tokens are computed; the first sampled token is the one scheduled now."""
    add_row(v4_runner, "r", prompt_len=129, computed=129, output=[17])
    assert step(v4_runner, [1]) == ("FULL", "FULL")
    assert counts(loader)["steps_overridden"] == 0


def test_runner_whose_model_is_not_the_plugins(configs, loader, monkeypatch):
    """A Llama runner in the same process: untouched, decided once, never counted as a step."""
    import patchkit_deepseek_v4.batch_dispatch_override as bdo

    calls = []
    real = bdo.plugin_model
    monkeypatch.setattr(bdo, "plugin_model", lambda r, ctx: calls.append(r) or real(r, ctx))
    runner = make_runner(configs["llama"])
    add_row(runner, "tail", prompt_len=129, computed=128)
    for _ in range(3):
        assert step(runner, [1]) == ("FULL", "FULL")
    assert calls == [runner]
    assert runner.__dict__[bdo.RUNNER_ATTR] is False
    loader.sync_calls()
    detail = loader.records[PATCH_ID].detail
    assert detail["steps_seen"] == 0
    assert detail["runners"] == ["CPUModelRunner: not plugin (architectures ['LlamaForCausalLM'] not in "
                                 "['DeepseekV4ForCausalLM'])"]


def test_v4_name_with_vllms_own_class_loaded_is_not_the_plugins(v4_runner, loader):
    """The decision follows the class actually loaded: vLLM's own Llama under the V4 name is untouched."""
    from vllm.model_executor.models.llama import LlamaForCausalLM

    v4_runner.model = object.__new__(LlamaForCausalLM)
    add_row(v4_runner, "tail", prompt_len=129, computed=128)
    assert step(v4_runner, [1]) == ("FULL", "FULL")
    loader.sync_calls()
    assert "served by vllm.model_executor.models.llama, not out_of_tree" in loader.records[PATCH_ID].detail["runners"][0]


def test_capture_and_dummy_runs_passing_a_bool_are_untouched(v4_runner, loader):
    """`_dummy_run` always passes force_uniform_decode as a bool; the caller's choice stands."""
    add_row(v4_runner, "tail", prompt_len=129, computed=128)
    kw = step_kwargs(v4_runner, [1])
    assert v4_runner._determine_batch_execution_and_padding(**kw, force_uniform_decode=True)[0].name == "FULL"
    assert v4_runner._determine_batch_execution_and_padding(**kw, force_uniform_decode=False)[0].name == "PIECEWISE"
    assert counts(loader)["steps_seen"] == 0


def test_positional_call_gets_the_override_in_its_own_slot(v4_runner, loader):
    """All arguments positional, force_uniform_decode=None among them: replaced in place, not duplicated."""
    add_row(v4_runner, "tail", prompt_len=129, computed=128)
    kw = step_kwargs(v4_runner, [1])
    args = (kw["num_tokens"], kw["num_reqs"], kw["num_scheduled_tokens_np"], kw["max_num_scheduled_tokens"],
            False, True, False, None)
    assert v4_runner._determine_batch_execution_and_padding(*args)[0].name == "PIECEWISE"
    assert counts(loader)["steps_overridden"] == 1


def test_counts_reach_the_written_record(v4_runner, loader, tmp_path):
    """What `vllm-patchkit status` reads: the worker's record file, after a flush."""
    add_row(v4_runner, "tail", prompt_len=129, computed=128)
    step(v4_runner, [1])
    v4_runner.input_batch.num_computed_tokens_cpu[0] = 129
    step(v4_runner, [1])
    loader.sync_calls()
    loader.flush()
    run = load_run(tmp_path / "status")
    (proc,) = [p for p in run.processes if p["role"] == "worker"]
    rec = next(r for r in proc["patches"] if r["patch"] == f"{PATCH_ID}@1")
    assert rec["state"] == "applied" and rec["calls"] == 2
    assert rec["detail"]["steps_seen"] == 2 and rec["detail"]["steps_overridden"] == 1
    assert rec["detail"]["cudagraph_modes"] == {"PIECEWISE": 1, "FULL": 1}
    json.dumps(rec)  # plain data
