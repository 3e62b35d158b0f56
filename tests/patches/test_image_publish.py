"""The image-publish patches on vLLM's real scheduler, on the CPU.

Everything vLLM does here is vLLM's own code: ``Scheduler`` and ``AsyncScheduler`` (scheduling, chunking,
preemption, finishing, aborting), their ``KVCacheManager`` / hybrid coordinator / ``MambaManager`` /
``BlockPool`` (allocation, hashing, ``cache_full_blocks``, ``resolve_block_hashes``, prefix hits), and
``get_kv_cache_configs`` (through the KV-config hook, which sizes the toy pool). The patches are installed by
the real loader in the engine_core role for the DeepSeek-V4 stand-in (exact architecture, out-of-tree class,
prefix caching), as in a server. What stands in for what cannot run here:

* the model's forward: sampled tokens are faked (token 7, or a stop token where a test says so), and under
  ``AsyncScheduler`` a step's output is delivered after the next step is scheduled, as EngineCore's batch
  queue does; so a decode step's boundary token is in flight while the next step is scheduled;
* the plugin's model and copier: a toy adapter (the KV-config hook test's ``ToyAdapter``: block 256, k = 3
  image groups) with a fake proxy layer spec and ``MambaSpec(align)`` image layers. Nothing copies bytes:
  these tests are about which blocks are published under which hash, and when.
"""

from __future__ import annotations

import pytest

from tests.conftest import process_loader
from tests.patches.test_kv_config_hook import BS, ToyAdapter, make_config, toy_specs
from vllm_patchkit import runtime
from vllm_patchkit.adapters import INTERVAL_ENV, REGISTRY
from vllm_patchkit.demo.tiny_model import build_tiny_model
from vllm_patchkit.patches import image_publish as ip

IDS = ["image-publish", "image-publish-suppress", "image-publish-finish", "image-publish-preempt",
       "image-publish-split"]
STOP = 99


@pytest.fixture
def toy():
    adapter = REGISTRY.register(ToyAdapter())
    yield adapter
    REGISTRY.unregister(adapter)


@pytest.fixture(scope="module")
def v4_checkpoint(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("imgpub-v4"), "DeepseekV4ForCausalLM")


@pytest.fixture
def patched(v4_checkpoint, toy, standin_registered, monkeypatch):
    """The loader in EngineCore, config stage run for the stand-in V4 with prefix caching (interval 512)."""
    monkeypatch.setenv(INTERVAL_ENV, "512")
    loader = process_loader("engine_core")
    loader.run_config_stage(make_config(v4_checkpoint, 4096, override=100))
    for pid in IDS:
        assert loader.records[pid].state == "applied", (pid, loader.records[pid].reason)
    yield loader
    loader.unpatch()
    runtime.reset()


def build(v4_checkpoint, toy, *, hash_block_size=BS, asynchronous=True, blocks=100):
    """vLLM's scheduler over a pool the KV-config hook sized (4 slots withheld, 3 image groups)."""
    import vllm.v1.engine.core as core
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    vc = make_config(v4_checkpoint, 4096, override=blocks)
    configs = core.get_kv_cache_configs(vc, [toy_specs(toy)], [blocks * 4096])  # EngineCore's copy: the hook
    sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = sched_cfg.num_blocks
    cls = AsyncScheduler if asynchronous else Scheduler
    return cls(vllm_config=vc, kv_cache_config=sched_cfg, structured_output_manager=StructuredOutputManager(vc),
               block_size=BS, hash_block_size=hash_block_size, log_stats=False)


def new_request(sched, rid, prompt, max_tokens=64):
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[STOP]),
                  None, block_hasher=kv_cache_utils.get_request_block_hasher(sched.hash_block_size, hash_fn))
    sched.add_request(req)
    return req


class Engine:
    """Drives a scheduler in EngineCore's order; the forward is faked (see the module docstring).

    With an AsyncScheduler, as ``EngineCore.step_with_batch_queue`` does: schedule step N, then take step
    N-1's output, process the aborts that came in meanwhile (``abort``), then deliver that output. With a
    Scheduler: schedule a step and deliver its output. ``stop_at[rid] = n``: the token sampled at position
    n of that request is the stop token."""

    def __init__(self, sched):
        self.sched = sched
        self.asynchronous = type(sched).__name__ == "AsyncScheduler"
        self.queue: list = []
        self.stop_at: dict[str, int] = {}

    def _output(self, out):
        from vllm.v1.outputs import ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests.get(rid)
            if req is None or req.is_prefill_chunk:
                sampled.append([])
                continue
            position = req.num_computed_tokens  # the token this step samples sits at this position
            sampled.append([STOP if self.stop_at.get(rid) == position else 7])
        return out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                      sampled_token_ids=sampled)

    def schedule(self):
        out = self.sched.schedule()
        self.queue.append(self._output(out))
        if not self.asynchronous:
            self.deliver()
        return out

    def deliver(self, abort=()):
        """The oldest step's output arrives; `abort`: request ids aborted just before (the aborts queue)."""
        from vllm.v1.request import RequestStatus

        if abort:
            self.sched.finish_requests(list(abort), RequestStatus.FINISHED_ABORTED)
        self.sched.update_from_output(*self.queue.pop(0))

    def step(self):
        out = self.schedule()
        while self.asynchronous and len(self.queue) > 1:
            self.deliver()
        return out

    def until(self, predicate, limit=200):
        for _ in range(limit):
            if predicate():
                return
            self.step()
        raise AssertionError("condition not reached")


def first_schedule_hit(engine, req, limit=10):
    """Step until `req` is scheduled; the tokens it started from (its prefix hit)."""
    for _ in range(limit):
        out = engine.step()
        if req.request_id in out.num_scheduled_tokens:
            return req.num_computed_tokens - out.num_scheduled_tokens[req.request_id]
    raise AssertionError(f"{req.request_id} not scheduled")


def book(sched):
    return ip.existing_book(sched.kv_cache_manager)


def counts(loader):
    loader.sync_calls()
    return loader.records["image-publish"].detail


def image_blocks(sched, boundary, key_request):
    """The blocks cached under the image boundary's hash, per image group (None where absent)."""
    from vllm.v1.core.kv_cache_utils import resolve_block_hashes

    pool = sched.kv_cache_manager.block_pool
    view = resolve_block_hashes(key_request.block_hashes, pool.hash_block_size, BS)
    n = boundary // BS
    if len(view) < n:
        return None
    gids = book(sched).layout.group_ids
    return pool.get_cached_block(view[n - 1], list(gids))


def held_image_blocks(sched, rid):
    """Per image group, the non-null blocks the request's block table holds."""
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    return [sum(1 for b in mgrs[g].req_to_blocks.get(rid, []) if not b.is_null) for g in book(sched).layout.group_ids]


def run_to_deferred_keep(sched, engine, prompt_len=1000, boundary=1024):
    """A request decoding under async scheduling until the step whose end is the keep at `boundary` is
    scheduled: the token that closes that block is in flight, so the keep is deferred."""
    req = new_request(sched, "r0", range(1, prompt_len + 1))
    engine.until(lambda: req.num_computed_tokens == boundary - 1)
    engine.schedule()  # the step ending on the boundary; the previous step's output is not delivered yet
    pending = book(sched).pending.get("r0")
    assert pending is not None and (pending.boundary, pending.kind, pending.deferred) == (boundary, "keep", True)
    assert req.num_tokens == boundary - 1  # the closing token is in flight
    return req


# ---------------------------------------------------------------------------
# Placement, publication, hits
# ---------------------------------------------------------------------------


def test_rungs_anchor_and_keeps_are_published_under_the_prefix_hash(patched, v4_checkpoint, toy):
    """Prompt 1000, interval 512: rung 512 (a chunk cut there), anchor 768 (the prompt's last full block),
    keep 1024 (decode; deferred under async, published while the request runs)."""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=40)
    first = engine.step()
    assert first.num_scheduled_tokens["r0"] == 512  # vLLM alone runs to 768 (its last cacheable boundary)
    engine.until(lambda: req.is_finished())
    for boundary in (512, 768, 1024):
        assert image_blocks(sched, boundary, req) is not None, boundary
    assert image_blocks(sched, 256, req) is None  # not an image boundary: vLLM's own caching is off
    c = counts(patched)
    assert c["filed"] == {"rung": 1, "anchor": 1, "keep": 1}
    assert (c["published"], c["deferred"], c["published_deferred"]) == (3, 1, 1)
    assert patched.records["image-publish-split"].detail["chunks_cut_at_rung"] == 1


def test_a_deferred_keep_is_published_while_its_request_runs_and_a_second_request_hits_it(patched, v4_checkpoint,
                                                                                           toy):
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    r0 = run_to_deferred_keep(sched, engine)
    assert image_blocks(sched, 1024, r0) is None
    engine.deliver()  # the closing token arrives: the hash exists, the keep waits for the next step
    assert book(sched).pending["r0"].boundary == 1024 and image_blocks(sched, 1024, r0) is None
    engine.step()  # r0's next step is scheduled: its keep is published first
    assert "r0" not in book(sched).pending and not r0.is_finished()
    published = image_blocks(sched, 1024, r0)
    assert published is not None
    # a second request with the same 1024-token prefix (r0's prompt and 24 sampled tokens) and more
    r1 = new_request(sched, "r1", r0.all_token_ids[:1024] + [5] * 100, max_tokens=4)
    assert first_schedule_hit(engine, r1) == 1024  # the prefix hit ends on the image
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    assert [mgrs[g].req_to_blocks["r1"][3] for g in book(sched).layout.group_ids] == published
    engine.until(lambda: r0.is_finished() and r1.is_finished(), limit=400)
    c = counts(patched)
    assert c["published_deferred"] >= 1 and c["dropped_on_abort"] == 0


def test_sync_scheduling_publishes_keeps_at_once(patched, v4_checkpoint, toy):
    sched = build(v4_checkpoint, toy, asynchronous=False)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=40)
    engine.until(lambda: req.num_computed_tokens == 1024)
    assert "r0" not in book(sched).pending and image_blocks(sched, 1024, req) is not None
    assert counts(patched)["deferred"] == 0


# ---------------------------------------------------------------------------
# Abort with a deferred keep (the IndexError), natural completion, preemption
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("hash_block_size", [256, 128])
def test_abort_with_a_deferred_keep_drops_it_and_frees_the_request(patched, v4_checkpoint, toy, hash_block_size):
    sched = build(v4_checkpoint, toy, hash_block_size=hash_block_size)
    engine = Engine(sched)
    pool = sched.kv_cache_manager.block_pool
    req = run_to_deferred_keep(sched, engine)
    image = book(sched).pending["r0"]
    assert book(sched).boundary_hash(req, 1024) is None
    if hash_block_size == 128:
        # the raw list is at the finer granularity: reading it at the image block size says "exists"
        assert len(req.block_hashes) >= 1024 // BS
    engine.deliver(abort=["r0"])  # EngineCore: the aborts queue, then the output (no IndexError)
    assert "r0" not in sched.requests and "r0" not in book(sched).pending
    assert all(b.ref_cnt == 0 and b.block_hash is None for b in image.blocks.values())
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # everything back but vLLM's null block
    c = counts(patched)
    assert (c["dropped_on_abort"], c["deferred"]) == (1, 1)
    assert patched.records["image-publish-finish"].detail["abort_dropped"] == 1
    engine.step()  # the aborted request's last in-flight output arrives and is ignored; the engine goes on


@pytest.mark.parametrize("hash_block_size", [256, 128])
def test_negative_control_publishing_the_deferred_keep_raises_index_error(patched, v4_checkpoint, toy,
                                                                          hash_block_size):
    """Without the rule: the naive publication calls vLLM's cache_full_blocks for the keep's block as soon as
    the request ends (at 128, after checking the raw hash list, which says the hash is there)."""
    from vllm.v1.core.block_pool import BlockPool

    sched = build(v4_checkpoint, toy, hash_block_size=hash_block_size)
    engine = Engine(sched)
    req = run_to_deferred_keep(sched, engine)
    image = book(sched).pending["r0"]
    pool = sched.kv_cache_manager.block_pool
    n = 1024 // BS
    naive_check = len(req.block_hashes) >= n if hash_block_size == 128 else True
    assert naive_check
    gid, block = next(iter(image.blocks.items()))
    with pytest.raises(IndexError):
        BlockPool.cache_full_blocks(pool, req, [pool.null_block] * (n - 1) + [block], n - 1, n, BS, gid)


def test_natural_completion_with_a_deferred_keep_publishes_it(patched, v4_checkpoint, toy):
    """The in-flight token that closes the keep's block is a stop token: the request finishes when it lands,
    and then the keep's hash exists."""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    engine.stop_at["r0"] = 1023
    req = run_to_deferred_keep(sched, engine)
    engine.deliver()  # the stop token closes the keep's block and finishes the request
    assert req.is_finished() and req.status.name == "FINISHED_STOPPED" and req.num_tokens == 1024
    assert image_blocks(sched, 1024, req) is not None
    c = counts(patched)
    assert (c["published_deferred"], c["dropped_on_abort"]) == (1, 0)
    assert patched.records["image-publish-finish"].detail["finish_published"] == 1


def test_preemption_drops_the_deferred_keep_and_the_request_resumes_from_its_last_image(patched, v4_checkpoint,
                                                                                         toy):
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = run_to_deferred_keep(sched, engine)
    image = book(sched).pending["r0"]
    # what the scheduler's own preemption does: off the running queue, then _preempt_request
    sched.running.remove(req)
    sched._preempt_request(req, 0.0)
    assert "r0" not in book(sched).pending and all(b.block_hash is None for b in image.blocks.values())
    assert counts(patched)["dropped_on_preemption"] == 1
    assert first_schedule_hit(engine, req) == 768  # it resumes from its last published image (the anchor)
    engine.until(lambda: req.is_finished(), limit=400)
    assert req.num_tokens == 1000 + 64 and req.num_preemptions == 1
    assert image_blocks(sched, 1024, req) is not None  # filed again after the resume, published this time


def test_the_book_never_holds_a_block_beyond_vllms_own_table(patched, v4_checkpoint, toy):
    """All but the last image are released: a pinned (undecided) image is always a block the request's own
    table still holds, so the book adds no block to what vLLM's align-mode manager holds.

    Measured here (AsyncScheduler, prompt 1000 cut at 512 and 768): vLLM's own table holds 3 blocks per image
    group for one step (the states at 512 and 768 and the running block at 1000: it frees on processed
    tokens, and a chunk is in flight), 2 otherwise; see the report of issue 14."""
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=600)
    mgrs = sched.kv_cache_manager.coordinator.single_type_managers
    extra_peak, table_peak = 0, 0
    while not req.is_finished():
        engine.step()
        pinned = book(sched).pending.get("r0")
        if pinned is not None:
            extra_peak = max(extra_peak, sum(1 for gid, b in pinned.blocks.items()
                                             if b not in mgrs[gid].req_to_blocks.get("r0", [])))
        if "r0" in sched.requests:
            table_peak = max(table_peak, *held_image_blocks(sched, "r0"))
    assert extra_peak == 0 and table_peak == 3
    assert counts(patched)["filed"] == {"rung": 1, "anchor": 1, "keep": 2}  # 1024 and 1536


def test_interval_zero_publishes_nothing_and_still_holds_working_blocks(patched, v4_checkpoint, toy,
                                                                        monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    sched = build(v4_checkpoint, toy)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 1001), max_tokens=40)
    held = []
    while not req.is_finished():
        engine.step()
        if "r0" in sched.requests:
            held.append(held_image_blocks(sched, "r0"))
    assert any(min(h) >= 1 for h in held) and all(max(h) <= 2 for h in held)
    for boundary in (256, 512, 768, 1024):
        assert image_blocks(sched, boundary, req) is None
    c = counts(patched)
    assert c["published"] == 0 and "filed" not in c


# ---------------------------------------------------------------------------
# As patches: who gets them
# ---------------------------------------------------------------------------


def test_skipped_without_prefix_caching(v4_checkpoint, toy, standin_registered):
    vc = make_config(v4_checkpoint, 4096, override=100)
    vc.cache_config.enable_prefix_caching = False
    loader = process_loader("engine_core")
    try:
        loader.run_config_stage(vc)
        for pid in IDS:
            rec = loader.records[pid]
            assert (rec.state, rec.code) == ("skipped", "precondition") and "prefix_caching" in rec.reason, pid
    finally:
        loader.unpatch()
        runtime.reset()


def test_a_model_without_image_groups_is_passed_through(patched, v4_checkpoint):
    """Registered adapters' proxy layers absent from the KV config: no book, vLLM's own caching."""
    from tests.patches.test_kv_config_hook import _llama_specs

    import vllm.v1.engine.core as core
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.structured_output import StructuredOutputManager

    vc = make_config(v4_checkpoint, 4096)
    configs = core.get_kv_cache_configs(vc, [_llama_specs()], [10**8])
    sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = sched_cfg.num_blocks
    sched = AsyncScheduler(vllm_config=vc, kv_cache_config=sched_cfg,
                           structured_output_manager=StructuredOutputManager(vc), block_size=BS, log_stats=False)
    engine = Engine(sched)
    req = new_request(sched, "r0", range(1, 600), max_tokens=8)
    engine.until(lambda: req.is_finished())
    assert book(sched) is None
    assert patched.records["image-publish"].detail["layout"] is None
