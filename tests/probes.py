"""A child process that runs the plugin's entry point as vLLM's front end does (the tests that need a real
`register()` in a fresh interpreter run this)."""

REGISTER = r"""
import os, sys
os.environ["VLLM_PATCHKIT_ROLE"] = "frontend"
import vllm.engine.arg_utils  # the front end loads the plugins from EngineArgs: vLLM has imported its config by then
from vllm_patchkit.runtime.plugin import register
try:
    register()
except Exception as exc:
    print("RAISED", type(exc).__name__, exc)
    sys.exit(3)
"""
