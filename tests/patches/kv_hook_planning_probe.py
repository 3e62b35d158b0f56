"""Run under vLLM 0.33.0's own sources (tests/release_sources.py): kv-config-hook@2 on the real
`vllm.v1.core.kv_cache_planning.get_kv_cache_configs`, and the live check of the 0.33 manifest.

Prints one JSON document; tests/patches/test_kv_config_hook_planning.py asserts on it. Scale and
adapter are the toy ones of tests/patches/test_kv_config_hook.py (block 256, pages of 4096 B, 11 blocks
withheld for 4 slots, k = 3 image groups, 100 physical blocks).
"""

from __future__ import annotations

import contextlib
import io
import os
import json
import sys
import tempfile
from pathlib import Path

import torch

from tests.patches.toy_adapter import BS, PAGE, PHYSICAL  # noqa: E402 (the seed's toy numbers)


def main() -> None:
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core import kv_cache_planning as planning
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from patchkit_deepseek_v4.adapters import REGISTRY
    from tests.patches.toy_adapter import ToyAdapter
    from vllm_patchkit.runtime.context import PatchContext
    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set, manifest_dirs
    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model
    from vllm_patchkit.declaration.manifest import load_manifests
    from patchkit_deepseek_v4 import kv_config_hook as hook
    from vllm_patchkit.upstream.findings import Finding
    from vllm_patchkit.runtime.verify import verify

    toy = REGISTRY.register(ToyAdapter())
    model = build_tiny_model(Path(tempfile.mkdtemp()))

    def config(max_model_len=-1):
        vc = EngineArgs(model=str(model), max_model_len=max_model_len, block_size=BS, dtype="float32",
                        enable_prefix_caching=True, max_num_seqs=4,
                        hf_overrides={"max_position_embeddings": 65536}).create_engine_config()
        vc.cache_config.mamba_cache_mode = "align"
        vc.cache_config.kv_cache_layout = "BLHNC"
        return vc

    def specs():
        out = {toy.proxy_layer_name: FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.uint8)}
        for name in toy.image_layer_names(3):
            out[name] = MambaSpec(block_size=BS, shapes=((PAGE,),), dtypes=(torch.uint8,), mamba_cache_mode="align")
        return out

    sources = installed_sources()
    ps = load_patch_set(sources)
    manifests = load_manifests(manifest_dirs(sources), ps)
    v2 = ps.patches["kv-config-hook@2"]
    out: dict = {"vllm": vllm.__version__, "vllm_file": vllm.__file__}

    # what EngineCore does on 0.33: group the (unpriced) specs, then call get_kv_cache_configs with the groups
    vc = config()
    s = specs()
    groups = planning.get_global_kv_cache_groups(vc, [s])
    ctx = PatchContext.detached(v2)
    (cfg,) = hook.get_kv_cache_configs_planning(planning.get_kv_cache_configs, None, (vc, [s], [PHYSICAL * PAGE], groups),
                                                {}, ctx)
    out["sized"] = {"num_blocks": cfg.num_blocks, "pages": sorted({g.kv_cache_spec.page_size_bytes for g in cfg.kv_cache_groups}),
                    "group_sizes": [len(g.layer_names) for g in cfg.kv_cache_groups],
                    "tensor_sizes": sorted({t.size for t in cfg.kv_cache_tensors}),
                    "max_model_len": vc.model_config.max_model_len, "decisions": ctx.counts.get("decisions")}

    # vLLM alone, given the specs already priced and regrouped (what the hook hands it), for comparison
    alone = config()
    priced = hook._priced_specs(toy, [specs()], PAGE)
    planning.get_kv_cache_configs(alone, priced, [PHYSICAL * PAGE], planning.get_global_kv_cache_groups(alone, priced))
    out["vllm_alone_max_model_len"] = alone.model_config.max_model_len

    # negative control: version 1's flow on 0.33 (specs priced, EngineCore's unpriced groups passed through)
    vc = config()
    s = specs()
    stale = planning.get_global_kv_cache_groups(vc, [s])
    ctx2 = PatchContext.detached(v2)

    def refit(vllm_config, groups, left):  # version 2's own re-fit: only the regrouping is left out
        from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder

        planning._auto_fit_max_model_len(get_kv_cache_config_builder(vllm_config), vllm_config, groups, left)

    try:
        hook._sized(planning.get_kv_cache_configs, (vc, [s], [PHYSICAL * PAGE], stale), {}, ctx2,
                    regroup=None, refit=refit)
        out["stale_groups"] = "no error"
    except Exception as exc:  # what the control is about
        out["stale_groups"] = f"{type(exc).__name__}: {exc}"

    # the 0.33 manifest's pins against this release, live (by import), as the loader verifies at start-up
    entry = {e.patch: e for e in manifests["0.33.0"].manifest.patches}
    out["verify"] = {}
    for key in ("kv-config-hook@2", "pool-bytes-passthrough@2", "batch-dispatch-override@1",
                "postprocess-sampled-passthrough@1"):
        got = verify(ps.patches[key], entry[key])
        out["verify"][key] = f"{got.code}: {got.reason}" if isinstance(got, Finding) else "ok"

    # `vllm-patchkit check --live` on the imported release: every patch against the 0.33 manifest. This probe
    # is already the isolated child `--live` would start (it imports 0.33's sources itself), so it reads in-process.
    from vllm_patchkit.tools import live
    from vllm_patchkit.tools.cli import main as cli

    os.environ[live.CHILD_ENV] = "1"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli(["check", "--live", "--format", "json"])
    doc = json.loads(buf.getvalue())
    out["check"] = {"exit": code, "release": doc["release"], "counts": doc["counts"],
                    "broken": {p["patch"]: [b["explain"] for b in p["breakages"]] for p in doc["patches"]
                               if p["status"] == "broken"}}
    print("PROBE-JSON " + json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
