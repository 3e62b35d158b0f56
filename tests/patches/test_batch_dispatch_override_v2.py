"""The V2 runner's patches on its real methods: batch-dispatch-override-v2 (`GPUModelRunner.gather_batch_req_state`)
and image-slot-events-v2 (`GPUModelRunner.finish_requests`, at the end).

What is real: the patch is applied by the framework (the shipped set and manifest, `Loader(role="worker")`,
both stages, on a VllmConfig that vLLM's EngineArgs built; the runner fact is `v2`); every call is vLLM's own
`gather_batch_req_state` of the installed release (the same source digest on 0.31.0, 0.33.0 and 0.34.0; the
0.34.0 run is tests/patches/test_batch_dispatch_v034.py); its result is what `execute_model` hands to
`dispatch_cg_and_sync_dp` → `CudaGraphManager.dispatch`, which considers the FULL decode graph only for a
uniform token count that is not None (vllm/v1/worker/gpu/cudagraph_utils.py, `dispatch`).

What stands in, and why: the V2 runner cannot be constructed on this CPU (it needs Triton/CUDA), so the runner
is the real class allocated without `__init__`, given the few fields the method reads (the request states'
prompt progress as numpy arrays, `decode_query_len`, no PP/PCP/adaptive verification); the scheduler output
is a namespace with the three fields the method reads. DeepseekV4ForCausalLM is served by the test stand-in's
out-of-tree class (registered in-process as its plugin does). A CUDA graph replay cannot run here: what is
asserted is the decision that selects it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import applied_in, process_loader

from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

ARCH = "DeepseekV4ForCausalLM"
STANDIN = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"
PATCH_ID = "batch-dispatch-override-v2"

# rows: (prompt/prefill length, tokens computed, tokens scheduled, placeholder drafts scheduled)
DECODE = (5, 6, 1, 0)  # a decode row (computed past its prompt)
ROWS = {
    "tail_after_prefix_hit": (9, 8, 1, 0),  # (a) 8 of 9 prompt tokens from the cache, 1 to compute
    "one_token_last_chunk": (9, 8, 1, 0),  # (b) the same shape: prior chunks computed
    "one_token_prompt": (1, 0, 1, 0),  # (c) nothing computed yet
    "two_token_tail_spec": (9, 7, 2, 0),  # (d) two real prompt tokens left, one speculative token
    "padded_tail_spec": (9, 8, 2, 1),  # (d') one prompt token padded with one placeholder draft
}


@pytest.fixture(scope="module")
def v2_config(tmp_path_factory):
    from vllm import ModelRegistry
    from vllm.engine.arg_utils import EngineArgs

    saved = ModelRegistry.models.get(ARCH)
    ModelRegistry.register_model(ARCH, STANDIN)
    model = build_tiny_model(tmp_path_factory.mktemp("ckpt") / "v4", architecture=ARCH)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # this CPU's config check refuses V2 while building
        cfg = EngineArgs(model=str(model), dtype="float32", max_model_len=512,
                         enable_prefix_caching=True).create_engine_config()
    yield cfg
    if saved is None:
        ModelRegistry.models.pop(ARCH, None)
    else:
        ModelRegistry.models[ARCH] = saved


@pytest.fixture
def v2_selected(monkeypatch):
    """vLLM's own rule (`VllmConfig.use_v2_model_runner` reads VLLM_USE_V2_MODEL_RUNNER live) selects V2."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")


def runner_with(cfg, rows, decode_query_len=1):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    ids = [f"r{i}" for i in range(len(rows))]
    prefill_len = np.array([r[0] for r in rows], dtype=np.int32)
    computed = np.array([r[1] for r in rows], dtype=np.int32)
    runner.__dict__.update(
        model_config=cfg.model_config, decode_query_len=decode_query_len, use_pp=False,
        adaptive_verification=None, pcp_manager=None,
        req_states=SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)},
                                   prefill_len=SimpleNamespace(np=prefill_len),
                                   num_computed_prefill_tokens=np.minimum(computed, prefill_len)))
    out = SimpleNamespace(num_scheduled_tokens={r: row[2] for r, row in zip(ids, rows)},
                          total_num_scheduled_tokens=sum(row[2] for row in rows),
                          scheduled_spec_decode_tokens={r: [-1] * row[3] for r, row in zip(ids, rows) if row[3]})
    return runner, out


def decision(cfg, row, dummy_run=False):
    """(decode_graph_eligible, uniform token count) of one step: the row under test beside a decode row."""
    decode = DECODE if row[3] == 0 else (5, 6, 2, 1)  # with one speculative token a decode row schedules 2
    runner, out = runner_with(cfg, [row, decode], decode_query_len=1 + (row[3] or row[2] - 1))
    state, count = runner.gather_batch_req_state(out, dummy_run)
    return (None if state is None else state.decode_graph_eligible), count


def test_without_the_patch_vllm_replays_full_decode_for_one_token_tails(v2_config):
    """The defect exists on V2 (vLLM's deliberate exception): (a), (b) and (d') are decode-graph eligible with
    a uniform token count, so `dispatch` offers the FULL decode graph; (c) and (d) are not."""
    got = {name: decision(v2_config, row) for name, row in ROWS.items()}
    assert got == {"tail_after_prefix_hit": (True, 1), "one_token_last_chunk": (True, 1),
                   "one_token_prompt": (False, None), "two_token_tail_spec": (False, None),
                   "padded_tail_spec": (True, 2)}


def test_with_the_patch_no_prefilling_row_gets_the_full_decode_graph(v2_config, v2_selected, tmp_path):
    with applied_in("worker", v2_config, PATCH_ID, tmp_path / "status") as loader:
        got = {name: decision(v2_config, row) for name, row in ROWS.items()}
        assert got == {name: (False, None) for name in ROWS}
        assert decision(v2_config, DECODE) == (True, 1)  # pure decode unchanged
        assert decision(v2_config, ROWS["tail_after_prefix_hit"], dummy_run=True) == (None, 1)  # capture/dummy
        loader.sync_calls()
        d = loader.records[PATCH_ID].detail
        # 5 rows + pure decode counted as real steps; the dummy run is not; (a), (b), (d') overridden
        assert {k: d.get(k) for k in ("steps_seen", "steps_overridden", "steps_overridden_decode_shaped")} == \
            {"steps_seen": 6, "steps_overridden": 3, "steps_overridden_decode_shaped": 3}


def test_a_runner_of_vllm_s_own_model_is_untouched(v2_config, v2_selected, tmp_path):
    """The decision follows the loaded model's class: vLLM's own Llama class is not the plugin's."""
    from vllm.model_executor.models.llama import LlamaForCausalLM

    with applied_in("worker", v2_config, PATCH_ID, tmp_path / "status"):
        runner, out = runner_with(v2_config, [ROWS["tail_after_prefix_hit"], DECODE])
        runner.__dict__["model"] = object.__new__(LlamaForCausalLM)
        runner.__dict__["get_model"] = lambda: runner.__dict__["model"]
        state, count = runner.gather_batch_req_state(out, False)
        assert (state.decode_graph_eligible, count) == (True, 1)


def test_the_v1_patch_is_not_needed_on_v2_and_the_v2_patch_not_on_v1(v2_config, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    loader = process_loader("worker", v2_config, status_dir=tmp_path / "v2")
    try:
        v1 = loader.records["batch-dispatch-override"]
        assert (v1.state, v1.code, v1.reason) == ("skipped", "precondition", "runner: expected v1, actual v2")
        assert loader.records[PATCH_ID].state == "applied"
    finally:
        loader.unpatch()
        runtime.reset()
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    loader = process_loader("worker", v2_config, status_dir=tmp_path / "v1")
    try:
        v2 = loader.records[PATCH_ID]
        assert (v2.state, v2.code) == ("skipped", "precondition")
    finally:
        loader.unpatch()
        runtime.reset()


# -- image-slot-events-v2: the V2 runner's finish_requests (same stand-ins: the runner without __init__) --------
def _v2_runner_for_events(cfg):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runner = object.__new__(GPUModelRunner)
    removed: list[str] = []
    runner.__dict__.update(model_config=cfg.model_config, pooling_runner=None, speculator=None,
                           _remove_request=removed.append)
    return runner, removed


def _step(finished=(), preempted=(), new=()):
    """The SchedulerOutput fields vLLM's finish_requests reads, and the new requests of the step."""
    return SimpleNamespace(finished_req_ids=set(finished), preempted_req_ids=set(preempted),
                           scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new])


def test_slot_events_v2_hear_finished_preempted_and_resumed(v2_config, v2_selected, tmp_path):
    """vLLM's real V2 `finish_requests` frees finished and preempted requests' state; the wrap hands the ids to
    the adapter layer's listeners, and a request that comes back (V2 re-sends it as a new one: no
    resumed_req_ids) is heard as resumed — once; a brand-new request is not."""
    from patchkit_deepseek_v4.adapters import SLOT_EVENTS

    heard = []
    stop = SLOT_EVENTS.listen(lambda f, p, r: heard.append((set(f), set(p), set(r))))
    try:
        with applied_in("worker", v2_config, "image-slot-events-v2", tmp_path / "status") as loader:
            runner, removed = _v2_runner_for_events(v2_config)
            runner.finish_requests(_step(new=["a", "b"]))  # nothing finished or preempted: no delivery
            runner.finish_requests(_step(preempted=["b"]))
            runner.finish_requests(_step(finished=["a"], new=["b", "c"]))
            runner.finish_requests(_step(new=["b"]))  # b again is not a resumption twice
            assert heard == [(set(), {"b"}, set()), ({"a"}, set(), {"b"})]
            assert removed == ["b", "a"]  # vLLM's own method ran
            loader.sync_calls()
            d = loader.records["image-slot-events-v2"].detail
            assert (d.get("deliveries"), d.get("finished"), d.get("preempted"), d.get("resumed")) == (2, 1, 1, 1)
    finally:
        stop()
    runner, _ = _v2_runner_for_events(v2_config)
    runner.finish_requests(_step(finished=["x"]))  # unpatched again: nobody hears
    assert len(heard) == 2
