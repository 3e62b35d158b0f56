"""Test-only vLLM general plugin registering a stand-in ``DeepseekV4ForCausalLM``.

Why: patches aimed at ATOM's DeepSeek-V4 check two things, the exact
architecture name and that vLLM's registry resolves it to an out-of-tree class.
This plugin makes both true for a tiny Llama checkpoint, so those patches can be
tested end to end on a CPU. It acts only with ``PATCHKIT_STANDIN=1``, so having
it installed changes nothing for other tests.

``patchkit_standin.state_executor.StateExecutor`` (used only when a serve names it with
``--distributed-executor-backend``) stands in for the plugin's worker side: KV specs with the plugin's shape,
state slots, image stores and restores (docs/adapters/stateful-standin.md).
"""

import logging
import os

ARCH = "DeepseekV4ForCausalLM"
MODEL_CLS = "patchkit_standin.model:StandinDeepseekV4ForCausalLM"

logger = logging.getLogger("vllm.patchkit_standin")  # under "vllm" so vLLM's handler prints it


def register() -> None:
    """vLLM ``vllm.general_plugins`` entry point; runs once in every vLLM process."""
    if os.environ.get("PATCHKIT_STANDIN") != "1":
        return
    from vllm import ModelRegistry

    # Lazy string form: nothing heavy is imported when the plugin loads.
    ModelRegistry.register_model(ARCH, MODEL_CLS)
    logger.info("patchkit_standin: registered %s -> %s (pid %d, title %r)",
                ARCH, MODEL_CLS, os.getpid(), _title())


def _title() -> str:
    """Process title at plugin load (Linux), to tell vLLM's process roles apart in logs."""
    try:
        with open("/proc/self/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"
