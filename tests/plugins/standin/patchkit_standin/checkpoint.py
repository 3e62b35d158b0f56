"""The stateful stand-in's checkpoint: the tiny Llama named ``DeepseekV4ForCausalLM`` with the V4 fields added.

The real ``DeepseekV4Adapter`` prices a checkpoint from its config.json (``V4Inputs.from_hf``); these are the
adapter's ``TINY`` configuration of docs/adapters/deepseek-v4.md (ratios ``[0, 4, 128, 4, 0]``, window 8,
D 64, R 16, Di 32). ``head_dim`` (64) is already the Llama's; ``model_type`` stays ``llama`` (the stand-in
executor never loads the weights, but vLLM's config code must parse the file). Used by the e2e test and by
the demo (``python -m patchkit_deepseek_v4.demo``).
"""

from __future__ import annotations

import json
from pathlib import Path

V4_FIELDS = {"compress_ratios": [0, 4, 128, 4, 0], "sliding_window": 8, "qk_rope_head_dim": 16,
             "index_head_dim": 32}
EXECUTOR = "patchkit_standin.state_executor.StateExecutor"


def build_v4_checkpoint(out_dir: Path) -> Path:
    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

    out = build_tiny_model(out_dir, "DeepseekV4ForCausalLM")
    path = out / "config.json"
    config = json.loads(path.read_text())
    if any(config.get(k) != v for k, v in V4_FIELDS.items()):
        config.update(V4_FIELDS)
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
