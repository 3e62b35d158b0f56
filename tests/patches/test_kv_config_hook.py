"""The KV-config hook on vLLM's real functions, on the CPU.

Everything vLLM does here is vLLM's own code: ``get_kv_cache_configs`` (grouping,
auto-fit, checks), ``_auto_fit_max_model_len`` (the re-fit), ``allocate_kv_cache``
(the worker's allocation), ``Scheduler`` with its ``KVCacheManager``/``BlockPool``.
What stands in for ATOM: a *fake proxy layer spec* (vLLM's ``FullAttentionSpec``
with a nominal page, named like a proxy) and ``MambaSpec(align)`` image layers,
sized by a toy adapter whose checkpoint spec gives the seed's toy numbers:
block size 256, pages of 4096 B, 4 slots of 11,000 B -> 11 blocks withheld,
images of 10,000 B -> k = 3 image groups.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from tests.conftest import process_loader
import torch
import yaml

from vllm_patchkit.runtime import state as runtime
from patchkit_deepseek_v4.adapters import DEMAND_ENV, INTERVAL_ENV, REGISTRY, CheckpointSpec, DeepseekV4Adapter, ModelAdapter
from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.declaration.declare import parse_patch
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model
from patchkit_deepseek_v4 import kv_config_hook as hook

from tests.patches.toy_adapter import BS, PAGE, PHYSICAL, ToyAdapter
STANDIN = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"
YAML = Path(hook.__file__).with_suffix(".yaml")


@pytest.fixture
def toy():
    adapter = REGISTRY.register(ToyAdapter())
    yield adapter
    REGISTRY.unregister(adapter)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("kvhook-llama"))


def make_config(model_dir, max_model_len, *, override=None, max_num_seqs=4, cache_dtype="auto", arch=None,
                block_size=BS, async_scheduling=None):
    """A real VllmConfig from vLLM's EngineArgs (block 256, prefix caching, Mamba align for the images).

    ``async_scheduling``: None keeps what vLLM resolved (off on the CPU), True/False sets it as
    ``--async-scheduling`` / ``--no-async-scheduling`` would (EngineCore then runs ``AsyncScheduler``)."""
    from vllm.engine.arg_utils import EngineArgs

    vc = EngineArgs(model=str(model_dir), max_model_len=max_model_len, block_size=block_size, dtype="float32",
                    enable_prefix_caching=True, max_num_seqs=max_num_seqs, num_gpu_blocks_override=override,
                    kv_cache_dtype=cache_dtype,
                    hf_overrides={"max_position_embeddings": 65536}).create_engine_config()
    vc.cache_config.mamba_cache_mode = "align"  # what vLLM uses for Mamba groups with prefix caching
    vc.cache_config.kv_cache_layout = "BLHNC"  # EngineCore resolves it before sizing; the CPU accepts it
    if async_scheduling is not None:
        vc.scheduler_config.async_scheduling = async_scheduling
    return vc


def toy_specs(adapter, k=3, proxy_page=512, image_page=PAGE, block_size=BS):
    """The fake proxy (nominal page 512 B until priced) and k single-layer image layers."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    specs = {adapter.proxy_layer_name: FullAttentionSpec(block_size=block_size, num_kv_heads=1,
                                                         head_size=proxy_page // (2 * block_size), dtype=torch.uint8)}
    for name in adapter.image_layer_names(k):
        specs[name] = MambaSpec(block_size=block_size, shapes=((image_page,),), dtypes=(torch.uint8,),
                                mamba_cache_mode="align")
    return specs


def call_hook(wrapped, *args, **kwargs):
    """The implementation as the framework calls a wrap of a module function: no instance, a context."""
    return hook.get_kv_cache_configs(wrapped, None, args, kwargs, PatchContext.detached(parse_patch(YAML)))


def run_hook(vc, specs, blocks=PHYSICAL, page=PAGE):
    from vllm.v1.core import kv_cache_utils

    return call_hook(kv_cache_utils.get_kv_cache_configs, vc, [specs], [blocks * page])


def vllm_alone(vc, specs, blocks=PHYSICAL, page=PAGE):
    """vLLM's function without the hook, given the proxy already priced at its real page."""
    from vllm.v1.core import kv_cache_utils

    priced = hook._priced_specs(REGISTRY.for_kv_specs([specs]), [specs], page)
    return kv_cache_utils.get_kv_cache_configs(vc, priced, [blocks * page])


# ---------------------------------------------------------------------------
# vLLM's real Scheduler, driven like EngineCore drives it (sampled tokens faked)
# ---------------------------------------------------------------------------


def make_scheduler(vc, configs):
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = sched_cfg.num_blocks
    return Scheduler(vllm_config=vc, kv_cache_config=sched_cfg, structured_output_manager=StructuredOutputManager(vc),
                     block_size=BS, log_stats=False)


def run_request(sched, total_len, *, decode=64, preempt_at=None, max_steps=400):
    """Serve one request of `total_len` tokens (prompt + `decode` generated); returns (request, stats)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)
    req = Request("r0", list(range(1, total_len - decode + 1)), SamplingParams(max_tokens=decode, ignore_eos=True),
                  None, block_hasher=kv_cache_utils.get_request_block_hasher(BS, hash_fn))
    sched.add_request(req)
    pool = sched.kv_cache_manager.block_pool
    stats = {"steps": 0, "min_free": pool.get_num_free_blocks(), "stuck": False, "preempted": 0}
    while sched.waiting or sched.running:
        out = sched.schedule()
        stats["steps"] += 1
        stats["min_free"] = min(stats["min_free"], pool.get_num_free_blocks())
        ids = list(out.num_scheduled_tokens)
        if not ids:
            stats["stuck"] = True
            break
        sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                        sampled_token_ids=sampled))
        if preempt_at is not None and stats["steps"] == preempt_at and req in sched.running:
            # What the scheduler's own preemption does: off the running queue, then _preempt_request.
            sched.running.remove(req)
            sched._preempt_request(req, 0.0)
            stats["preempted"] += 1
        if stats["steps"] >= max_steps:
            break
    return req, stats


# ---------------------------------------------------------------------------
# Toy scale: 100 physical blocks, 11 withheld, block 256, 3 image groups
# ---------------------------------------------------------------------------


def test_toy_scale_refits_to_20992_where_vllm_alone_fits_23808(checkpoint, toy):
    alone_cfg = make_config(checkpoint, -1)
    vllm_alone(alone_cfg, toy_specs(toy))
    assert alone_cfg.model_config.max_model_len == 23_808  # 100 - null - 2x3 = 93 blocks

    vc = make_config(checkpoint, -1)
    configs = run_hook(vc, toy_specs(toy))
    assert vc.model_config.max_model_len == 20_992  # 100 - 11 - null - 2x3 = 82 blocks
    (cfg,) = configs
    assert cfg.num_blocks == PHYSICAL - 11
    # priced at the real page: every group's spec is 4096 B per block, the proxy's nominal 512 B is gone
    assert {g.kv_cache_spec.page_size_bytes for g in cfg.kv_cache_groups} == {PAGE}
    assert [len(g.layer_names) for g in cfg.kv_cache_groups] == [1, 1, 1, 1]
    # the allocation still covers all 100 physical blocks (the slot tail keeps its bytes)
    assert {t.size for t in cfg.kv_cache_tensors} == {PHYSICAL * PAGE}
    rec = hook.plan_pool(toy, make_config(checkpoint, -1), [toy_specs(toy)], [PHYSICAL * PAGE])
    assert (rec.physical, rec.withheld, rec.k, rec.image_groups, rec.left_for_history) == (100, 11, 3, 3, 82)


def test_toy_allocation_covers_every_physical_block_and_slots_live_in_the_tail(checkpoint, toy):
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    vc = make_config(checkpoint, -1)
    (cfg,) = run_hook(vc, toy_specs(toy))
    caches = allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout.BLHNC, [BS] * len(cfg.kv_cache_groups))
    proxy = caches[toy.proxy_layer_name]
    storage = proxy.untyped_storage()
    assert storage.nbytes() == PHYSICAL * PAGE  # vLLM allocated all 100 blocks
    assert all(v.untyped_storage().data_ptr() == storage.data_ptr() for v in caches.values())  # one pool
    assert proxy.shape[0] == PHYSICAL - 11  # vLLM's views address the 89 pool blocks only
    # the 4 slots of 11,000 B fit behind the pool, inside the allocation
    sizing = toy.sizing(vc)
    assert sizing.slot_offset(PHYSICAL, 3) + sizing.spec.slot_bytes <= PHYSICAL * PAGE
    assert sizing.slot_offset(PHYSICAL, 0) == (PHYSICAL - 11) * PAGE


def test_toy_request_of_the_refit_length_is_admitted_by_vllms_scheduler(checkpoint, toy):
    vc = make_config(checkpoint, -1)
    configs = run_hook(vc, toy_specs(toy))
    sched = make_scheduler(vc, configs)
    req, stats = run_request(sched, vc.model_config.max_model_len)
    assert req.is_finished() and req.num_tokens == 20_992 and req.num_preemptions == 0, stats
    assert stats["min_free"] == 0  # the pool is exactly one max-length request at its peak


# ---------------------------------------------------------------------------
# Minimum pool, +-1
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("preempt_at", [None, 5, 15], ids=["straight", "preempt-mid-prefill", "preempt-mid-decode"])
def test_exact_minimum_serves_a_max_length_request(checkpoint, toy, preempt_at):
    L = 20_992  # minimum physical = ceil(L/256)=82 + 2x3 + null + 11 withheld = 100
    vc = make_config(checkpoint, L, override=PHYSICAL)
    configs = run_hook(vc, toy_specs(toy))
    assert configs[0].num_blocks == 89 and vc.model_config.max_model_len == L
    req, stats = run_request(make_scheduler(vc, configs), L, preempt_at=preempt_at)
    assert req.is_finished() and req.num_tokens == L, (req.status, stats)
    assert stats["preempted"] == (0 if preempt_at is None else 1) and not stats["stuck"]


def test_one_block_less_really_cannot_serve_it(checkpoint, toy):
    """Why the minimum is what it is: with one pool block fewer, vLLM's scheduler never finishes the request."""
    L = 20_992
    vc = make_config(checkpoint, L, override=PHYSICAL)
    configs = run_hook(vc, toy_specs(toy))
    for cfg in configs:
        cfg.num_blocks -= 1  # bypass the check to watch what would happen
    req, stats = run_request(make_scheduler(vc, configs), L)
    assert stats["stuck"] and not req.is_finished()


def test_one_block_short_is_refused_with_the_numbers_and_the_override_remedy(checkpoint, toy):
    vc = make_config(checkpoint, 20_992, override=PHYSICAL - 1)
    vllm_alone(copy.deepcopy(vc), toy_specs(toy), blocks=PHYSICAL - 1)  # vLLM alone would start
    with pytest.raises(hook.PoolTooSmall) as info:
        run_hook(vc, toy_specs(toy), blocks=PHYSICAL - 1)
    msg = str(info.value)
    for part in ("99 blocks of 4096 B", "11 withheld for 4 state slots of 11000 B", "1 vLLM null block",
                 "6 image working blocks (2 x 3 image groups) = 81 blocks", "ceil(20992/256) = 82",
                 "1 block(s) short", "--num-gpu-blocks-override to at least 100",
                 "lower --max-model-len to at most 20736"):
        assert part in msg, (part, msg)
    assert "gpu-memory-utilization" not in msg  # the count is pinned: more memory would not help


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_async_scheduling_counts_the_synchronous_two_working_blocks(checkpoint, toy, asynchronous):
    """Issue 22: image-publish-release frees a request's older image blocks itself (as the native plugin does),
    so async scheduling holds 2 per image group like the synchronous scheduler (measured on the real
    AsyncScheduler in tests/patches/test_image_publish.py). The re-fit and the minimum pool are the synchronous
    figures: 100 - 11 - 1 - 2x3 = 82 blocks = 20,992 tokens; 100 physical for 20,992; 99 refused."""
    vc = make_config(checkpoint, -1, async_scheduling=asynchronous)
    (cfg,) = run_hook(vc, toy_specs(toy))
    assert vc.model_config.max_model_len == 20_992 and cfg.num_blocks == PHYSICAL - 11
    plan = hook.plan_pool(toy, make_config(checkpoint, -1, async_scheduling=asynchronous), [toy_specs(toy)],
                          [PHYSICAL * PAGE])
    assert (plan.working_per_group, plan.working_blocks, plan.left_for_history) == (2, 6, 82)
    assert plan.minimum_physical(20_992) == 82 + 6 + 1 + 11 == PHYSICAL
    vc = make_config(checkpoint, 20_992, override=99, async_scheduling=asynchronous)
    with pytest.raises(hook.PoolTooSmall, match="6 image working blocks .2 x 3 image groups.*1 block.s. short"):
        run_hook(vc, toy_specs(toy), blocks=99)


def test_one_block_short_without_override_names_memory(checkpoint, toy):
    vc = make_config(checkpoint, 20_992)
    with pytest.raises(hook.PoolTooSmall) as info:
        run_hook(vc, toy_specs(toy), blocks=PHYSICAL - 1)
    msg = str(info.value)
    assert "at least 100 blocks (409600 B, now 405504 B): raise --gpu-memory-utilization" in msg, msg
    assert "num-gpu-blocks-override" not in msg


def test_auto_fit_with_no_block_left_is_refused(checkpoint, toy):
    vc = make_config(checkpoint, -1)
    with pytest.raises(hook.PoolTooSmall, match=r"--max-model-len -1 \(auto-fit\) needs at least 1"):
        run_hook(vc, toy_specs(toy), blocks=18)  # 18 - 11 - 1 - 6 = 0


def test_fewer_slots_is_offered_when_it_would_fit(checkpoint, toy):
    vc = make_config(checkpoint, 20_992, override=PHYSICAL - 1)
    with pytest.raises(hook.PoolTooSmall, match=r"lower --max-num-seqs to at most 3"):
        run_hook(vc, toy_specs(toy), blocks=PHYSICAL - 1)


# ---------------------------------------------------------------------------
# Interval 0, pass-through, disagreements
# ---------------------------------------------------------------------------


def test_interval_zero_publishes_nothing_but_still_counts_working_blocks(checkpoint, toy, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    vc = make_config(checkpoint, -1)
    configs = run_hook(vc, toy_specs(toy))
    assert vc.model_config.max_model_len == 20_992 and configs[0].num_blocks == 89
    plan = hook.plan_pool(toy, make_config(checkpoint, -1), [toy_specs(toy)], [PHYSICAL * PAGE])
    assert not plan.publishes and plan.working_blocks == 6 and plan.notes


def test_bad_interval_stops_start_up(checkpoint, toy, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "1000")
    with pytest.raises(ValueError, match="multiple of the 256-token block"):
        run_hook(make_config(checkpoint, -1), toy_specs(toy))


def _llama_specs():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return {f"model.layers.{i}.self_attn.attn": FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=64,
                                                                   dtype=torch.float32) for i in range(2)}


def _vllm_v4_specs(vc):
    """The specs vLLM's own DeepSeek-V4 layers report (their own get_kv_cache_spec, on stand-in selves)."""
    import vllm.models.deepseek_v4.attention as v4
    from vllm.models.deepseek_v4.compressor import CompressorStateCache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    cc, specs = vc.cache_config, {}
    for i, r in enumerate([1, 4, 128]):
        p = f"model.layers.{i}.self_attn"
        specs[f"{p}.swa_cache"] = DeepseekV4SWACache.get_kv_cache_spec(
            NS(cache_config=cc, bounded_replay=False, block_size=64, head_dim=512, dtype=torch.uint8, window_size=128,
               packed_bytes_per_token=584, packed_page_alignment=576), vc)
        if r > 1:
            coff = 2 if r == 4 else 1
            specs[p] = v4.DeepseekV4Attention.get_kv_cache_spec(
                NS(compress_ratio=r, kv_cache_dtype="fp8_ds_mla", head_dim=512, kv_cache_torch_dtype=torch.uint8), vc)
            specs[f"{p}.compressor.state_cache"] = CompressorStateCache.get_kv_cache_spec(
                NS(block_size=4 if r == 4 else 8, state_dim=2 * coff * 512, dtype=torch.float32,
                   sliding_window=coff * r), vc)
        if r == 4:
            specs[f"{p}.indexer.k_cache"] = v4.DeepseekV4IndexerCache.get_kv_cache_spec(
                NS(cache_config=cc, head_dim=132, dtype=torch.uint8, compress_ratio=4), vc)
            specs[f"{p}.indexer.compressor.state_cache"] = CompressorStateCache.get_kv_cache_spec(
                NS(block_size=4, state_dim=2 * 2 * 128, dtype=torch.float32, sliding_window=8), vc)
    return specs


@pytest.mark.parametrize("max_model_len", [-1, 4096])
@pytest.mark.parametrize("which", ["llama", "vllm-own-v4"])
def test_without_the_proxy_layer_it_passes_through_unchanged(checkpoint, toy, which, max_model_len):
    from vllm.v1.core import kv_cache_utils

    cache_dtype = "fp8_ds_mla" if which == "vllm-own-v4" else "auto"
    base = make_config(checkpoint, max_model_len, cache_dtype=cache_dtype)
    specs = _llama_specs() if which == "llama" else _vllm_v4_specs(base)
    memory = [2000 * 37_440 * 4]
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    expected = kv_cache_utils.get_kv_cache_configs(a, [copy.deepcopy(specs)], memory)
    got = call_hook(kv_cache_utils.get_kv_cache_configs, b, [copy.deepcopy(specs)], memory)
    assert got == expected
    assert b.model_config.max_model_len == a.model_config.max_model_len


def test_model_and_adapter_disagreeing_about_k_stops_start_up(checkpoint, toy):
    with pytest.raises(ValueError, match=r"registered 2 Toy image layers.*k = 3 \(an image of 10000 B in pages of 4096 B\)"):
        run_hook(make_config(checkpoint, -1), toy_specs(toy, k=2))


def test_layers_at_another_block_size_than_the_adapters_stop_start_up(checkpoint, toy):
    """The adapter's numbers are per block of its size; specs at another size would mix units silently."""
    with pytest.raises(ValueError, match=r"toy_proxy has block size 128, the Toy adapter's checkpoint spec is per "
                                         r"256-token block: serve with --block-size 256"):
        run_hook(make_config(checkpoint, -1, block_size=128), toy_specs(toy, block_size=128), page=PAGE)


def test_proxy_spec_larger_than_the_real_page_stops_start_up(checkpoint, toy):
    with pytest.raises(ValueError, match="has 8192 B per block, the adapter's real bytes per block are 4096 B"):
        run_hook(make_config(checkpoint, -1), toy_specs(toy, proxy_page=2 * PAGE))


def test_forwards_keyword_calls(checkpoint, toy):
    from vllm.v1.core import kv_cache_utils

    vc = make_config(checkpoint, -1)
    configs = call_hook(kv_cache_utils.get_kv_cache_configs, vllm_config=vc,
                                        kv_cache_specs=[toy_specs(toy)], available_memory=[PHYSICAL * PAGE])
    assert configs[0].num_blocks == 89 and vc.model_config.max_model_len == 20_992


@pytest.mark.parametrize("with_proxy", [True, False])
def test_calls_vllm_the_way_it_was_called(checkpoint, toy, with_proxy):
    """Positional stays positional, keyword stays keyword; only the specs are replaced (and only with a proxy)."""
    import functools

    from vllm.v1.core import kv_cache_utils

    seen = []

    @functools.wraps(kv_cache_utils.get_kv_cache_configs)
    def spy(*args, **kwargs):
        seen.append((len(args), sorted(kwargs)))
        return kv_cache_utils.get_kv_cache_configs(*args, **kwargs)

    specs = toy_specs(toy) if with_proxy else _llama_specs()
    call_hook(spy, make_config(checkpoint, -1), kv_cache_specs=[specs], available_memory=[10**7])
    call_hook(spy, make_config(checkpoint, -1), [specs], [10**7])
    assert seen == [(1, ["available_memory", "kv_cache_specs"]), (3, [])]


# ---------------------------------------------------------------------------
# The DeepSeek-V4 adapter through the hook (fake proxy spec, V4 fields on the config)
# ---------------------------------------------------------------------------

FLASH = dict(num_hidden_layers=43, compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0], sliding_window=128, head_dim=512,
             qk_rope_head_dim=64, index_head_dim=128, num_nextn_predict_layers=1)


def test_v4_adapter_prices_the_proxy_and_withholds_its_slots(checkpoint):
    """The plugin's native V4-Flash fp8 spec at block 128 (docs/adapters/deepseek-v4.md): page 531,712 B,
    k = 11 image groups; 8 slots take 252 blocks of bytes, ATOM's carve of 400 blocks withholds 264."""
    from vllm.v1.core import kv_cache_utils

    adapter = next(a for a in REGISTRY.adapters if isinstance(a, DeepseekV4Adapter))
    block = adapter.block_size
    assert block == 128
    vc = make_config(checkpoint, -1, max_num_seqs=8, cache_dtype="fp8", block_size=block)
    for key, value in FLASH.items():
        setattr(vc.model_config.hf_config, key, value)
    sizing = adapter.sizing(vc)
    page = sizing.page_bytes
    assert (page, sizing.k, sizing.withheld_blocks, sizing.withheld_for(400)) == (531_712, 11, 252, 264)
    specs = toy_specs(adapter, k=11, image_page=page, block_size=block)  # fake proxy, nominal 512 B until priced
    (cfg,) = call_hook(kv_cache_utils.get_kv_cache_configs, vc, [specs], [400 * page])
    assert cfg.num_blocks == 400 - 264
    assert {g.kv_cache_spec.page_size_bytes for g in cfg.kv_cache_groups} == {page}
    assert vc.model_config.max_model_len == (400 - 264 - 1 - 2 * 11) * block  # 14,464


# TINY of tests/adapters/test_deepseek_v4.py (docs/adapters/deepseek-v4.md): fp8, page 8,704 B, slot 104,448 B, k = 4.
TINY = dict(compress_ratios=[0, 4, 128, 4, 0], sliding_window=8, head_dim=64, qk_rope_head_dim=16, index_head_dim=32)
TINY_PAGE = 8_704


def _v4_tiny(checkpoint, max_model_len, override=None):
    """A real VllmConfig with the V4 fields of TINY, 2 slots, fp8, block 128; the V4 adapter; its specs."""
    adapter = next(a for a in REGISTRY.adapters if isinstance(a, DeepseekV4Adapter))
    vc = make_config(checkpoint, max_model_len, override=override, max_num_seqs=2, cache_dtype="fp8",
                     block_size=adapter.block_size)
    for key, value in TINY.items():
        setattr(vc.model_config.hf_config, key, value)
    return adapter, vc, toy_specs(adapter, k=4, image_page=TINY_PAGE, block_size=adapter.block_size)


def test_v4_minimum_pool_is_atoms_carve_plus_one_request(checkpoint):
    """Issue 14 section 1: the hook withholds the adapter's count at the physical block count. One request of
    7,424 tokens (58 blocks) + 2 x 4 image working blocks + null needs 67 pool blocks. Contiguously that is
    67 + 24 = 91 physical blocks; ATOM's carve gives 66 from 91 to 101 (its block region is whole slots of
    rows) and 67 at 102. 102 is served, 101 is refused with the carve's numbers, and so is 91."""
    from vllm.v1.core import kv_cache_utils

    L = 58 * 128
    adapter, vc, specs = _v4_tiny(checkpoint, L, override=102)
    sizing = adapter.sizing(vc)
    assert (sizing.page_bytes, sizing.spec.slot_bytes, sizing.k, sizing.num_slots) == (TINY_PAGE, 104_448, 4, 2)
    assert (sizing.withheld_blocks, sizing.withheld_for(102), sizing.withheld_for(101)) == (24, 35, 35)
    (cfg,) = call_hook(kv_cache_utils.get_kv_cache_configs, vc, [specs], [102 * TINY_PAGE])
    assert cfg.num_blocks == 102 - 35 == 67 and vc.model_config.max_model_len == L
    assert {t.size for t in cfg.kv_cache_tensors} == {102 * TINY_PAGE}
    plan = hook.plan_pool(adapter, vc, [specs], [102 * TINY_PAGE])
    assert (plan.withheld, plan.withheld_contiguous, plan.left_for_history, plan.minimum_physical(L)) == \
        (35, 24, 58, 102)

    for physical, short in ((101, 1), (91, 11)):
        adapter, vc, specs = _v4_tiny(checkpoint, L, override=physical)
        vllm_alone(copy.deepcopy(vc), specs, blocks=physical, page=TINY_PAGE)  # vLLM alone would start
        with pytest.raises(hook.PoolTooSmall) as info:
            call_hook(kv_cache_utils.get_kv_cache_configs, vc, [specs], [physical * TINY_PAGE])
        msg = str(info.value)
        withheld = {101: 35, 91: 25}[physical]
        for part in (f"{physical} blocks of 8704 B (block size 128) - {withheld} withheld for 2 state slots of "
                     "104448 B (the slots' bytes alone take 24 blocks; the adapter's carve of "
                     f"{physical} blocks withholds the rest) - 1 vLLM null block - 8 image working blocks "
                     f"(2 x 4 image groups) = {physical - withheld - 9} blocks for the paged history",
                     "ceil(7424/128) = 58", f"{short} block(s) short",
                     "--num-gpu-blocks-override to at least 102", "lower --max-num-seqs to at most 1"):
            assert part in msg, (part, msg)


def test_v4_memory_remedy_and_auto_fit_use_the_carve(checkpoint):
    from vllm.v1.core import kv_cache_utils

    adapter, vc, specs = _v4_tiny(checkpoint, 58 * 128)
    with pytest.raises(hook.PoolTooSmall, match=r"give the KV cache at least 102 blocks \(887808 B, now 879104 B\)"):
        call_hook(kv_cache_utils.get_kv_cache_configs, vc, [specs], [101 * TINY_PAGE])
    # auto-fit: 100 physical -> 34 withheld (the by-hand figure), 66 - null - 8 = 57 blocks = 7,296 tokens
    adapter, vc, specs = _v4_tiny(checkpoint, -1)
    (cfg,) = call_hook(kv_cache_utils.get_kv_cache_configs, vc, [specs], [100 * TINY_PAGE])
    assert cfg.num_blocks == 66 and vc.model_config.max_model_len == 57 * 128


# ---------------------------------------------------------------------------
# As a patch: the YAML, the loader, EngineCore's copy
# ---------------------------------------------------------------------------


def test_yaml_declares_what_the_code_reads():
    doc = yaml.safe_load(YAML.read_text())
    assert doc["reads_env"] == [INTERVAL_ENV, DEMAND_ENV] and doc["feature"] == "kv-config-hook"  # declared by image-publish
    assert tuple(doc["when"]["architectures"]) == DeepseekV4Adapter.architectures
    assert doc["when"]["served_by"] == DeepseekV4Adapter.served_by
    assert doc["copies"] == ["vllm.v1.engine.core:get_kv_cache_configs"]


@pytest.fixture
def engine_core_loader():
    loader = process_loader("engine_core")
    yield loader
    loader.unpatch()
    runtime.reset()


@pytest.fixture(scope="module")
def v4_checkpoint(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("kvhook-v4"), "DeepseekV4ForCausalLM")


def test_applied_in_engine_core_for_the_plugins_v4_with_its_copy_rebound(v4_checkpoint, toy, standin_registered,
                                                                          engine_core_loader):
    import vllm.v1.engine.core as core
    from vllm.v1.core import kv_cache_utils

    original = kv_cache_utils.get_kv_cache_configs
    vc = make_config(v4_checkpoint, -1)
    engine_core_loader.run_config_stage(vc)
    rec = engine_core_loader.records["kv-config-hook"]
    assert rec.state == "applied", (rec.code, rec.reason)
    assert rec.detail["places"] == ["vllm.v1.core.kv_cache_utils:get_kv_cache_configs",
                                    "vllm.v1.engine.core:get_kv_cache_configs"]
    assert core.get_kv_cache_configs is kv_cache_utils.get_kv_cache_configs is not original
    # EngineCore's call site reaches the hook: toy proxy sized, plain specs passed through
    core.get_kv_cache_configs(vc, [toy_specs(toy)], [PHYSICAL * PAGE])
    assert vc.model_config.max_model_len == 20_992
    core.get_kv_cache_configs(make_config(v4_checkpoint, 512), [_llama_specs()], [10**8])
    engine_core_loader.sync_calls()
    assert rec.calls == 2 and rec.detail["decisions"] == {"sized": 1, "passthrough": 1}
    engine_core_loader.unpatch()
    assert core.get_kv_cache_configs is original


def test_skipped_for_vllms_own_v4_and_other_models(checkpoint, v4_checkpoint, engine_core_loader):
    from vllm.v1.core import kv_cache_utils

    original = kv_cache_utils.get_kv_cache_configs
    engine_core_loader.run_config_stage(make_config(v4_checkpoint, 512))  # served by vLLM's own class
    rec = engine_core_loader.records["kv-config-hook"]
    assert (rec.state, rec.code) == ("skipped", "precondition") and "served_by" in rec.reason
    assert kv_cache_utils.get_kv_cache_configs is original


def test_skipped_for_a_llama(checkpoint, engine_core_loader):
    engine_core_loader.run_config_stage(make_config(checkpoint, 512))
    rec = engine_core_loader.records["kv-config-hook"]
    assert (rec.state, rec.code) == ("skipped", "precondition") and "architectures" in rec.reason


def test_auto_fit_helper_signature_is_checked(monkeypatch, v4_checkpoint, standin_registered, engine_core_loader):
    """The helper is declared in `uses` and pinned: a changed one stops start-up before the hook is installed."""
    from vllm.v1.core import kv_cache_utils

    from vllm_patchkit.declaration.errors import RequiredPatchFailed

    original = kv_cache_utils.get_kv_cache_configs
    monkeypatch.setattr(kv_cache_utils, "_auto_fit_max_model_len", lambda builder, vllm_config, groups, mem: None)
    with pytest.raises(RequiredPatchFailed):
        engine_core_loader.run_config_stage(make_config(v4_checkpoint, -1))
    rec = engine_core_loader.records["kv-config-hook"]
    assert (rec.state, rec.code) == ("failed", "uses") and "_auto_fit_max_model_len" in rec.reason
    assert kv_cache_utils.get_kv_cache_configs is original


def test_detached_context_keeps_the_decisions(checkpoint, toy):
    """Called outside the plugin, the counters and notes stay on the context (never lost)."""
    from vllm.v1.core import kv_cache_utils

    ctx = PatchContext.detached(parse_patch(YAML))
    hook.get_kv_cache_configs(kv_cache_utils.get_kv_cache_configs, None,
                              (make_config(checkpoint, -1), [toy_specs(toy)], [PHYSICAL * PAGE]), {}, ctx)
    assert ctx.counts == {"decisions": {"sized": 1}} and ctx.notes["last_call"]["decision"] == "sized"
    with pytest.raises(hook.PoolTooSmall):
        hook.get_kv_cache_configs(kv_cache_utils.get_kv_cache_configs, None,
                                  (make_config(checkpoint, 20_992, override=PHYSICAL - 1), [toy_specs(toy)],
                                   [(PHYSICAL - 1) * PAGE]), {}, ctx)
    assert ctx.counts == {"decisions": {"sized": 1, "refused": 1}} and "block(s) short" in ctx.refused


def test_refusal_at_start_up_marks_the_record_refused(v4_checkpoint, toy, standin_registered, engine_core_loader):
    """Regression: a call-time refusal used to leave the record `applied` (detail only)."""
    import vllm.v1.engine.core as core

    vc = make_config(v4_checkpoint, 20_992, override=PHYSICAL - 1)
    engine_core_loader.run_config_stage(vc)
    with pytest.raises(hook.PoolTooSmall):
        core.get_kv_cache_configs(vc, [toy_specs(toy)], [(PHYSICAL - 1) * PAGE])
    rec = engine_core_loader.records["kv-config-hook"]
    assert (rec.state, rec.code) == ("refused", "refused")
    assert "1 block(s) short" in rec.reason and rec.detail["decisions"] == {"refused": 1}
