"""What a patch's preconditions need, and how a lifecycle case meets them: really where possible.

Derived from the patches' `when`, so a new precondition value gets a real config (a tiny
checkpoint, engine arguments, environment) or is forced, with a note saying so in the
case's result. Read by the harness's children and, for the architectures to build
checkpoints of, by the side that prepares a run (no vLLM import here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

DEFAULT_ARCH = "LlamaForCausalLM"
STANDIN = "vllm_patchkit.tools.testing.standin:OutOfTreeStandin"


@dataclass
class Recipe:
    """How to make this process meet a patch's preconditions: really where possible, forced where not."""

    architecture: Optional[str] = None  # config.json architecture of the tiny checkpoint
    standin: bool = False  # register an out-of-tree class for `architecture`
    engine_kwargs: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # before the config is built (None: unset)
    env_after_build: dict = field(default_factory=dict)  # vLLM reads these live (runner choice)
    forced_facts: dict = field(default_factory=dict)  # config facts no config here can have
    platform: Optional[str] = None  # Loader(platform=...) when the patch excludes this one
    notes: list = field(default_factory=list)


def recipe_for(patches) -> Recipe:
    """One recipe meeting the `when` of every patch given (a patch and what it requires)."""
    r = Recipe()
    for p in patches:
        w = p.when
        if w.architectures:
            r.architecture = r.architecture or w.architectures[0]
        if w.served_by == "out_of_tree":
            r.standin = True
        elif w.served_by not in (None, "vllm"):
            r.forced_facts["served_by"] = {(r.architecture or DEFAULT_ARCH): w.served_by}
            r.notes.append(f"served_by {w.served_by!r} forced: no such module here")
        if w.served_by == "out_of_tree" and not w.architectures:
            r.architecture = r.architecture or "OutOfTreeForCausalLM"
        if w.runner == "v1":
            r.env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        elif w.runner == "v2":
            r.env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
            r.env_after_build["VLLM_USE_V2_MODEL_RUNNER"] = "1"
            r.notes.append("runner v2: config built with V1 (the CPU build refuses V2: needs Triton), then "
                           "VLLM_USE_V2_MODEL_RUNNER=1, which VllmConfig.use_v2_model_runner reads live")
        if w.prefix_caching is not None:
            r.engine_kwargs["enable_prefix_caching"] = w.prefix_caching
        if w.speculative:
            r.engine_kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 2,
                                                     "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        if w.cudagraph_mode:
            r.forced_facts["cudagraph_mode"] = w.cudagraph_mode[0]
            r.notes.append(f"cudagraph_mode {w.cudagraph_mode[0]} forced (CPU has no CUDA graphs)")
        for name, value in (w.env or {}).items():
            r.env[name] = value
        if w.platform and "cpu" not in w.platform:
            r.platform = w.platform[0]
            r.notes.append(f"platform {w.platform[0]} forced (this machine is cpu)")
        if p.env_default is not None:
            r.env.setdefault(p.env_default.name, None)  # the default is only set when unset
    return r


def architectures(recipes) -> list[str]:
    """The checkpoints a run needs: the default one and each recipe's architecture."""
    return sorted({DEFAULT_ARCH} | {r.architecture for r in recipes if r.architecture})
