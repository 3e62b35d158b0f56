"""image-slot-events on vLLM's real V1 runner, fed by vLLM's real Scheduler (CPU).

What is real: the patch is applied by the framework (the shipped set and the installed release's manifest,
`Loader(role="worker")`, import and config stages on a VllmConfig built by vLLM's own EngineArgs from a tiny
local checkpoint named `DeepseekV4ForCausalLM`); the runner is a fully constructed `CPUModelRunner` (vLLM's
CPU runner, a `GPUModelRunner` subclass that inherits `_update_states`); every step is vLLM's own
`Scheduler.schedule()` and the runner's own `_update_states(scheduler_output)`, called as `execute_model`
calls it, with the `SchedulerOutput` the scheduler produced: requests finish (their token budget, an abort),
are preempted (a pool too small for both requests) and resume.

What stands in, and why: the forward. No weights are loaded (the patch and `_update_states` never read them),
so the runner's KV cache is not allocated either: the runner is given the KV-cache config vLLM planned for the
scheduler (`runner.kv_cache_config`, the only part `_update_states` reads) instead of `initialize_kv_cache`;
each scheduled request that reached the end of its known tokens "samples" token 7, handed back to the
scheduler through `update_from_output`, as EngineCore does after the worker's step. The architecture is
served by the test-only out-of-tree class `patchkit_standin.model:StandinDeepseekV4ForCausalLM` (a thin
subclass of vLLM's Llama), registered in-process as the stand-in plugin does in a server.
"""

from __future__ import annotations

import ast

import pytest

from tests.patches.process_groups import single_rank

from tests.conftest import applied_in, process_loader
from patchkit_deepseek_v4.adapters import SLOT_EVENTS
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

PATCH_ID = "image-slot-events"
TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states"
BLOCK = 16
SAMPLED = 7


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("slot-events")
    return {"v4": build_tiny_model(base / "v4", "DeepseekV4ForCausalLM"),
            "llama": build_tiny_model(base / "llama", "LlamaForCausalLM")}


def make_config(model_dir, *, blocks=10, prefix_caching=True):
    """A real VllmConfig (block 16, a pool of `blocks` blocks: two 40-token prompts growing to 100 cannot
    both stay). VLLM_USE_BREAKABLE_CUDAGRAPH is held at 0: for V4 names vLLM would set it in os.environ."""
    from vllm.engine.arg_utils import EngineArgs

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
        cfg = EngineArgs(model=str(model_dir), dtype="float32", max_model_len=128, max_num_seqs=4,
                         block_size=BLOCK, enable_prefix_caching=prefix_caching,
                         num_gpu_blocks_override=blocks).create_engine_config()
    cfg.cache_config.kv_cache_layout = "NHD"  # EngineCore resolves it before sizing (vLLM's default)
    return cfg


@pytest.fixture(scope="module")
def distributed(checkpoints):
    """vLLM's process groups for one rank (gloo), as a worker has them: `_update_states` asks the PP group
    whether this is the last rank."""
    with single_rank(make_config(checkpoints["llama"])):
        yield


@pytest.fixture
def loader(tmp_path, checkpoints, standin_registered, distributed):
    with applied_in("worker", make_config(checkpoints["v4"]), PATCH_ID, tmp_path / "status") as ldr:
        yield ldr


@pytest.fixture
def heard():
    """A listener on the registration point: every delivery, as (finished, preempted, resumed) sets."""
    got: list[tuple[set, set, set]] = []
    stop = SLOT_EVENTS.listen(lambda f, p, r: got.append((set(f), set(p), set(r))))
    yield got
    stop()


class Stand:
    """vLLM's Scheduler and a real CPUModelRunner, driven in EngineCore's order (sync scheduling)."""

    def __init__(self, cfg):
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=64, dtype=torch.float32)
        specs = {f"model.layers.{i}.self_attn.attn": spec for i in range(2)}
        blocks = cfg.cache_config.num_gpu_blocks_override
        configs = kv_cache_utils.get_kv_cache_configs(cfg, [specs], [blocks * 2 * spec.page_size_bytes])
        sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
        cfg.cache_config.num_gpu_blocks = sched_cfg.num_blocks
        with set_current_vllm_config(cfg):
            self.sched = Scheduler(vllm_config=cfg, kv_cache_config=sched_cfg,
                                   structured_output_manager=StructuredOutputManager(cfg), block_size=BLOCK,
                                   log_stats=False)
            self.runner = CPUModelRunner(cfg, torch.device("cpu"))
        # What initialize_kv_cache would keep; that call also allocates the tensors and binds them to the
        # model's attention layers, and no model is loaded here (_update_states reads only the groups).
        self.runner.kv_cache_config = configs[0]
        self.sent: list[tuple[set, set, set]] = []  # what the scheduler's outputs carried, non-empty steps only

    def add(self, rid, prompt_len, max_tokens):
        from vllm import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.request import Request

        hash_fn = get_hash_fn_by_name("sha256")
        kv_cache_utils.init_none_hash(hash_fn)
        self.sched.add_request(Request(rid, [(11 * i) % 300 + 3 for i in range(prompt_len)],
                                       SamplingParams(max_tokens=max_tokens, ignore_eos=True), None,
                                       block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK, hash_fn)))

    def step(self):
        from vllm.v1.outputs import ModelRunnerOutput

        so = self.sched.schedule()
        events = (set(so.finished_req_ids), set(so.preempted_req_ids or ()),
                  set(so.scheduled_cached_reqs.resumed_req_ids))
        if any(events):
            self.sent.append(events)
        self.runner._update_states(so)  # what GPUModelRunner.execute_model calls first
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests[rid]
            sampled.append([] if req.num_computed_tokens < req.num_tokens else [SAMPLED])
        self.sched.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled))
        return so

    def run(self, limit=400):
        for _ in range(limit):
            if not self.sched.requests:
                self.step()  # the step that tells the runner about the last finish
                return
            self.step()
        raise AssertionError("requests did not finish")


def drive(cfg):
    """Two requests that cannot both stay in the pool (one is preempted, resumes, both finish), a third
    aborted while it runs: every event kind vLLM's runner gets."""
    from vllm.v1.request import RequestStatus

    stand = Stand(cfg)
    stand.add("a", 40, 60)
    stand.add("b", 40, 60)
    stand.add("c", 20, 100)
    for _ in range(3):
        stand.step()
    stand.sched.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
    stand.run()
    return stand


def test_applied_in_the_worker_at_the_runner_class_vllm_uses(loader):
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    rec = loader.records[PATCH_ID]
    assert rec.stage == "config" and rec.detail["places"] == [TARGET]
    assert not [f for f in rec.findings if f["code"] == "shadowed"], rec.findings
    assert "_update_states" not in CPUModelRunner.__dict__  # the CPU runner inherits the wrapped method


def test_the_listener_hears_exactly_the_ids_vllms_scheduler_sent(loader, heard, checkpoints):
    stand = drive(make_config(checkpoints["v4"]))
    finished = set().union(*(f for f, _, _ in stand.sent))
    preempted = set().union(*(p for _, p, _ in stand.sent))
    resumed = set().union(*(r for _, _, r in stand.sent))
    assert finished == {"a", "b", "c"} and preempted and resumed <= preempted and resumed, stand.sent
    assert heard == stand.sent  # step by step, the same sets, nothing more
    loader.sync_calls()
    rec = loader.records[PATCH_ID]
    assert rec.calls >= len(stand.sent)  # once per step, empty steps included
    assert {k: rec.detail[k] for k in ("finished", "preempted", "resumed", "deliveries")} == {
        "finished": 3, "preempted": len(preempted), "resumed": len(resumed), "deliveries": len(stand.sent)}


def test_negative_control_without_the_patch_nothing_is_heard(checkpoints, heard, standin_registered, distributed):
    """The same run on vLLM's unpatched runner: vLLM's own _update_states tells the registration point nothing,
    so the test above can only pass through the patch."""
    stand = drive(make_config(checkpoints["v4"]))
    assert stand.sent and heard == []


def test_a_failing_listener_stops_the_step_naming_itself(loader, checkpoints):
    def broken_allocator(finished, preempted, resumed):
        raise KeyError("slot of an unknown request")

    stop = SLOT_EVENTS.listen(broken_allocator)
    try:
        with pytest.raises(RuntimeError, match="broken_allocator failed on finished=.*KeyError"):
            drive(make_config(checkpoints["v4"]))
    finally:
        stop()


def test_the_registration_point_hears_a_listener_once_until_it_stops():
    """A plugin's allocator registers a bound method: registering it again (a new bound-method object) is the
    same listener; the returned function unregisters it."""
    from patchkit_deepseek_v4.adapters import SlotEvents

    class Allocator:
        def __init__(self):
            self.heard = []

        def release(self, finished, preempted, resumed):
            self.heard.append((finished, preempted, resumed))

    events, alloc = SlotEvents(), Allocator()
    stop = events.listen(alloc.release)
    events.listen(alloc.release)
    events.deliver({"a"}, None, ["b"])
    assert alloc.heard == [(frozenset({"a"}), frozenset(), frozenset({"b"}))]
    stop()
    events.deliver({"c"}, (), ())
    assert len(alloc.heard) == 1


def test_needed_without_prefix_caching_skipped_for_llama_and_the_v2_runner(tmp_path, checkpoints,
                                                                           standin_registered, monkeypatch):
    """The slots exist with or without prefix caching, so the patch is needed either way; a Llama gets
    nothing; the V2 runner (no `_update_states`) gets a skip naming the runner, never an inert wrap. On this
    CPU the V2 runner cannot start ("Model Runner V2 requires Triton"), so that config is judged with
    VLLM_USE_V2_MODEL_RUNNER=1, which vLLM's own `VllmConfig.use_v2_model_runner` reads live."""
    cases = [("v4, no prefix caching", make_config(checkpoints["v4"], prefix_caching=False), False, "applied", None),
             ("llama", make_config(checkpoints["llama"]), False, "skipped", "architectures"),
             ("v4 on the V2 runner", make_config(checkpoints["v4"]), True, "skipped",
              "runner: expected v1, actual v2")]
    for name, cfg, v2, state, reason in cases:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
        assert cfg.use_v2_model_runner is v2
        ldr = process_loader("worker", cfg, status_dir=tmp_path / name.replace(" ", "_").replace(",", ""))
        try:
            rec = ldr.records[PATCH_ID]
            assert rec.state == state, (name, rec.code, rec.reason)
            if reason:
                assert rec.code == "precondition" and reason in rec.reason, (name, rec.reason)
        finally:
            ldr.unpatch()
            runtime.reset()


def _defines(source: str, cls: str, method: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return any(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) and b.name == method
                       for b in node.body)
    raise AssertionError(f"no class {cls}")


def _fields(source: str, cls: str) -> set[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {b.target.id for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)}
    raise AssertionError(f"no class {cls}")


@pytest.mark.parametrize("version", ["installed", "0.33.0"])
def test_the_runners_and_fields_the_declaration_relies_on(version):
    """What the YAML says of vLLM, read from the source: the V1 CPU runner inherits `_update_states`, the V2
    runner (and its CPU subclass) has none, and the SchedulerOutput fields the wrap reads exist (0.33.0: from
    its wheel's sources, tests/release_sources.py)."""
    from pathlib import Path

    if version == "installed":
        import vllm

        root = Path(vllm.__file__).parent
    else:
        from tests.release_sources import sources_or_skip

        root = sources_or_skip(version) / "vllm"
    read = lambda rel: (root / rel).read_text()  # noqa: E731
    assert _defines(read("v1/worker/gpu_model_runner.py"), "GPUModelRunner", "_update_states")
    assert not _defines(read("v1/worker/cpu_model_runner.py"), "CPUModelRunner", "_update_states")
    assert not _defines(read("v1/worker/gpu/model_runner.py"), "GPUModelRunner", "_update_states")
    assert not _defines(read("v1/worker/cpu/model_runner.py"), "CPUModelRunner", "_update_states")
    output = read("v1/core/sched/output.py")
    assert {"finished_req_ids", "preempted_req_ids", "scheduled_cached_reqs"} <= _fields(output, "SchedulerOutput")
    assert "resumed_req_ids" in _fields(output, "CachedRequestData")
