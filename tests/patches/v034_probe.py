"""Run under vLLM 0.34.0's own sources (tests/release_sources.py): the ported V4 set on 0.34.0's real code.

- batch-dispatch-override-v2's implementation around 0.34.0's real `GPUModelRunner.gather_batch_req_state`
  (the runner allocated without `__init__`, given the fields the method reads; the rows of
  tests/patches/test_batch_dispatch_override_v2.py);
- kv-config-hook@2 on 0.34.0's real `get_kv_cache_configs` / `_auto_fit_max_model_len` (the toy adapter and
  numbers of tests/patches/kv_hook_planning_probe.py), with image-kv-zeroing-off@2 around the real
  `KVCacheConfig.__post_init__`, and the hook with the extensible KV cache on;
- the 0.34.0 manifest's pins verified live (by import), as the loader verifies them at start-up.

0.34.0's CPU platform refuses a config without triton-cpu (`check_and_update_config`); that one check is
skipped. Prints one line `PROBE-JSON {...}`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from tests.patches.toy_adapter import BS, PAGE, PHYSICAL  # noqa: E402 (the seed's toy numbers)
ARCH = "DeepseekV4ForCausalLM"
ROWS = {"tail_after_prefix_hit": (9, 8, 1, 0), "one_token_prompt": (1, 0, 1, 0),
        "two_token_tail_spec": (9, 7, 2, 0), "padded_tail_spec": (9, 8, 2, 1), "decode": (5, 6, 1, 0)}


def wrapped_method(cls, name, impl, ctx):
    """Install `impl` around `cls.name` as the framework's wrap does (forwarding wrapped, instance, args, kwargs)."""
    original = cls.__dict__[name]

    def method(self, *args, **kwargs):
        return impl(lambda *a, **k: original(self, *a, **k), self, args, kwargs, ctx)
    setattr(cls, name, method)
    return original


def dispatch(out: dict, cfg, ps) -> None:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    from patchkit_deepseek_v4 import batch_dispatch_override_v2 as impl
    from vllm_patchkit.runtime.context import PatchContext

    def decide(row):
        decode = ROWS["decode"] if row[3] == 0 else (5, 6, 2, 1)
        rows = [row, decode]
        runner = object.__new__(GPUModelRunner)
        prefill = np.array([r[0] for r in rows], dtype=np.int32)
        runner.__dict__.update(
            model_config=cfg.model_config, decode_query_len=1 + (row[3] or row[2] - 1), use_pp=False,
            adaptive_verification=None, pcp_manager=None,
            req_states=SimpleNamespace(req_id_to_index={"a": 0, "b": 1}, prefill_len=SimpleNamespace(np=prefill),
                                       num_computed_prefill_tokens=np.minimum([r[1] for r in rows], prefill)))
        sched = SimpleNamespace(num_scheduled_tokens={"a": row[2], "b": decode[2]},
                                total_num_scheduled_tokens=row[2] + decode[2],
                                scheduled_spec_decode_tokens={k: [-1] * r[3] for k, r in zip("ab", rows) if r[3]})
        state, count = runner.gather_batch_req_state(sched, False)
        return [state.decode_graph_eligible, count]

    out["dispatch_without"] = {name: decide(row) for name, row in ROWS.items()}
    ctx = PatchContext.detached(ps.patches["batch-dispatch-override-v2@1"])
    original = wrapped_method(GPUModelRunner, "gather_batch_req_state", impl.gather_batch_req_state, ctx)
    try:
        out["dispatch_with"] = {name: decide(row) for name, row in ROWS.items()}
    finally:
        GPUModelRunner.gather_batch_req_state = original
    out["dispatch_counts"] = {k: ctx.counts.get(k) for k in ("steps_seen", "steps_overridden")}


def planning_and_zeroing(out: dict, ps, model_dir: Path) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from patchkit_deepseek_v4.adapters import REGISTRY
    from tests.patches.toy_adapter import ToyAdapter
    from patchkit_deepseek_v4 import image_kv_zeroing_off as zoff
    from patchkit_deepseek_v4 import kv_config_hook as hook
    from vllm_patchkit.runtime.context import PatchContext

    toy = REGISTRY.register(ToyAdapter())

    def config(extensible=None):
        vc = EngineArgs(model=str(model_dir), max_model_len=-1, block_size=BS, dtype="float32",
                        enable_prefix_caching=True, max_num_seqs=4,
                        hf_overrides={"max_position_embeddings": 65536}).create_engine_config()
        vc.cache_config.mamba_cache_mode = "align"
        vc.cache_config.kv_cache_layout = "BLHNC"
        if extensible is not None:
            vc.cache_config.enable_extensible_kv_cache = extensible
        return vc

    def specs():
        s = {toy.proxy_layer_name: FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.uint8)}
        for name in toy.image_layer_names(3):
            s[name] = MambaSpec(block_size=BS, shapes=((PAGE,),), dtypes=(torch.uint8,), mamba_cache_mode="align")
        return s

    def sized(vc):
        s = specs()
        ctx = PatchContext.detached(ps.patches["kv-config-hook@2"])
        groups = planning.get_global_kv_cache_groups(vc, [s])
        return hook.get_kv_cache_configs_planning(planning.get_kv_cache_configs, None,
                                                  (vc, [s], [PHYSICAL * PAGE], groups), {}, ctx), ctx

    vc = config()
    (cfg,), ctx = sized(vc)
    out["sized"] = {"num_blocks": cfg.num_blocks, "max_model_len": vc.model_config.max_model_len,
                    "tensor_sizes": sorted({t.size for t in cfg.kv_cache_tensors}),
                    "zeroing_without_patch": cfg.needs_kv_cache_zeroing}
    zctx = PatchContext.detached(ps.patches["image-kv-zeroing-off@2"])
    original = wrapped_method(kvi.KVCacheConfig, "__post_init__", zoff.post_init, zctx)
    try:
        (cfg,), _ = sized(config())
        out["zeroing_with_patch"] = cfg.needs_kv_cache_zeroing
        out["zeroing_counts"] = zctx.counts.get("zeroing_off")
        other = config()
        llama = [{"model.layers.0.attn": specs()[toy.proxy_layer_name],
                  "model.layers.1.mamba": specs()[toy.image_layer_names(1)[0]]}]
        plain = planning.get_kv_cache_configs(other, llama, [PHYSICAL * PAGE],
                                              planning.get_global_kv_cache_groups(other, llama))
        out["zeroing_other_model"] = plain[0].needs_kv_cache_zeroing
    finally:
        kvi.KVCacheConfig.__post_init__ = original
    try:
        sized(config(extensible=True))
        out["extensible"] = "no error"
    except Exception as exc:
        out["extensible"] = f"{type(exc).__name__}: {exc}"


def verify_live(out: dict, ps, manifests) -> None:
    from vllm_patchkit.runtime.verify import verify
    from vllm_patchkit.upstream.findings import Finding

    entry = {e.patch: e for e in manifests["0.34.0"].manifest.patches}
    out["verify"] = {}
    for key in ("batch-dispatch-override-v2@1", "kv-config-hook@2", "image-kv-zeroing-off@2",
                "pool-bytes-passthrough@2", "postprocess-sampled-passthrough@1", "breakable-cudagraph-opt-out@1"):
        got = verify(ps.patches[key], entry[key])
        out["verify"][key] = f"{got.code}: {got.reason}" if isinstance(got, Finding) else "ok"


def main() -> int:
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.platforms import current_platform

    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set, manifest_dirs
    from vllm_patchkit.declaration.manifest import load_manifests
    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

    type(current_platform).check_and_update_config = classmethod(lambda cls, config: None)
    ModelRegistry.register_model(ARCH, "patchkit_standin.model:StandinDeepseekV4ForCausalLM")
    base = Path(tempfile.mkdtemp())
    v4 = build_tiny_model(base / "v4", architecture=ARCH)
    toy = build_tiny_model(base / "toy")
    sources = installed_sources()
    ps = load_patch_set(sources)
    manifests = load_manifests(manifest_dirs(sources), ps)
    out: dict = {"vllm": vllm.__version__}
    cfg = EngineArgs(model=str(v4), max_model_len=512, dtype="float32").create_engine_config()
    dispatch(out, cfg, ps)
    planning_and_zeroing(out, ps, toy)
    verify_live(out, ps, manifests)
    print("PROBE-JSON " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
