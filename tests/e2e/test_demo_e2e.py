"""The README's first command, as a new user runs it: `python -m patchkit_deepseek_v4.demo` (scripts/demo.sh after set-up).

Three real serves (the tiny Llama, the V4 stand-in with vLLM's CPU worker, the stateful V4 stand-in) and the
summary a newcomer reads: the Llama's DeepSeek-V4 patches skipped for its architecture, the dispatch override
counting overridden steps, the KV pool sized by the adapter, an image published and a prefix hit restored
right; every run's status exit 0, and the demo's own exit code 0.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.demo]


def test_demo_serves_all_three_and_summarises_what_applied(tmp_path):
    done = subprocess.run([sys.executable, "-m", "patchkit_deepseek_v4.demo", "--workdir", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    summary = out[out.index("=== what the framework did"):]
    llama, v4, stateful = summary.splitlines()[1:4]
    assert re.search(r"tiny Llama: [1-9]\d* DeepSeek-V4 patches skipped in EngineCore \(architectures: expected "
                     r"\['DeepseekV4ForCausalLM'\], actual \['LlamaForCausalLM'\]\); status exit 0", llama), llama
    m = re.search(r"batch-dispatch-override applied in the worker, (\d+) of (\d+) steps overridden; status exit 0", v4)
    assert m and int(m.group(1)) > 0, v4
    m = re.search(r"KV pool sized by the adapter .* images published (\d+), deferred \d+; "
                  r"prefix-hit restores (\d+) right, (\d+) wrong, stores \d+; status exit 0", stateful)
    assert m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1 and m.group(3) == "0", stateful
