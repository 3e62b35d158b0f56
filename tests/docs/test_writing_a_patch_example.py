"""The complete patch in docs/writing-a-patch.md works: loaded from the doc's text, applied to vLLM's real BlockPool.

The YAML and the module are taken verbatim from the doc (only the implementation's import path is pointed
at a temporary module), pinned from the installed vLLM, applied by the loader, and driven through real calls.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from tests.framework.helpers import make_loader, pinned_entry

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-a-patch.md"


def example() -> tuple[dict, str]:
    """The YAML and the Python of the doc's "A complete patch" section."""
    text = DOC.read_text()
    section = text[text.index("### A complete patch"):]
    blocks = re.findall(r"```(yaml|python)\n(.*?)```", section, re.S)
    doc = yaml.safe_load(next(body for lang, body in blocks if lang == "yaml"))
    source = next(body for lang, body in blocks if lang == "python")
    return doc, source


def test_the_complete_example_is_short():
    doc, source = example()
    assert len(yaml.safe_dump(doc).splitlines()) + len(source.strip().splitlines()) < 40


def test_the_complete_example_applies_and_counts_on_a_real_block_pool(tmp_path, monkeypatch):
    from vllm.v1.core.block_pool import BlockPool

    doc, source = example()
    assert doc["implementation"] == "patchkit_deepseek_v4.block_grab_probe:get_new_blocks"
    (tmp_path / "block_grab_probe_doc.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    doc["implementation"] = "block_grab_probe_doc:get_new_blocks"
    loader = make_loader(tmp_path, {"block_grab_probe": doc}, [pinned_entry("block-grab-probe@1", doc["target"])],
                         role="engine_core")
    try:
        loader.run_import_stage()
        rec = loader.records["block-grab-probe"]
        assert rec.state == "applied", (rec.code, rec.reason)
        pool = BlockPool(num_gpu_blocks=16, enable_caching=False, hash_block_size=16)  # 15 free (null block)
        assert len(pool.get_new_blocks(2)) == 2
        assert len(pool.get_new_blocks(num_blocks=8)) == 8  # 8 > 13 // 2: greedy
        loader.sync_calls()
        assert rec.calls == 2
        assert (rec.detail["allocations"], rec.detail["greedy_allocations"]) == (2, 1)
    finally:
        loader.unpatch()
        sys.modules.pop("block_grab_probe_doc", None)
