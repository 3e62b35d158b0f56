"""Run under vLLM 0.34.0's own sources (tests/release_sources.py): build its real VllmConfig for a tiny
checkpoint named DeepseekV4ForCausalLM (served out of tree by the test stand-in's class, registered by name
as its plugin does), read the precondition facts, and judge every shipped patch's `when` on them.

0.34.0's CPU platform refuses a config without triton-cpu (`check_and_update_config`); that one check is
skipped here, everything else in `VllmConfig.__post_init__` is vLLM's own. Prints one JSON line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


def main() -> None:
    import vllm
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.platforms import current_platform

    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
    from vllm_patchkit.declaration.preconditions import Unknown, config_facts, unmet_at_config
    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

    type(current_platform).check_and_update_config = classmethod(lambda cls, config: None)
    ModelRegistry.register_model("DeepseekV4ForCausalLM", "patchkit_standin.model:StandinDeepseekV4ForCausalLM")
    model = build_tiny_model(Path(tempfile.mkdtemp()) / "v4", architecture="DeepseekV4ForCausalLM")
    cfg = EngineArgs(model=str(model), max_model_len=512, dtype="float32").create_engine_config()
    facts = config_facts(cfg)
    unknown = {}
    for patch in load_patch_set(installed_sources()).patches.values():
        judged = unmet_at_config(patch.when, facts)
        if isinstance(judged, Unknown):
            unknown[patch.key] = str(judged)
    print(json.dumps({"version": vllm.__version__, "has_use_v2_model_runner": hasattr(cfg, "use_v2_model_runner"),
                      "facts": facts, "unknown": unknown}))


if __name__ == "__main__":
    main()
