"""The generated docs are current: CI fails when the YAML changed and `vllm-patchkit docs` was not run."""

from __future__ import annotations

from pathlib import Path

from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.docs import HEADER, generate, write_or_check

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_committed_generated_docs_are_current():
    assert write_or_check(DOCS, check=True) == [], "run `vllm-patchkit docs` and commit docs/"


def test_check_detects_a_stale_page(tmp_path):
    for name, text in generate().items():
        (tmp_path / name).write_text(text)
    assert main(["docs", "--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "env.md").write_text((tmp_path / "env.md").read_text().replace("VLLM_PATCHKIT_STATUS_DIR", "X"))
    assert main(["docs", "--check", "--out", str(tmp_path)]) == 1
    assert main(["docs", "--out", str(tmp_path)]) == 0
    assert main(["docs", "--check", "--out", str(tmp_path)]) == 0


def test_every_page_opens_with_do_not_edit_naming_the_command():
    from vllm_patchkit.tools import docs_failures

    for name, text in generate().items():
        # the YAML's pages say so; the failure codes' page names the framework's rows it is made from
        assert text.startswith(docs_failures.HEADER if name == docs_failures.NAME else HEADER), name
        assert "DO NOT EDIT" in text.splitlines()[0] and "`vllm-patchkit docs`" in text.splitlines()[0]


def test_patch_page_covers_every_patch_and_env_page_every_declared_variable():
    from vllm_patchkit.declaration.declare import installed_sources, load_patch_set
    from vllm_patchkit.declaration.knobs import KNOBS

    pages = generate()
    ps = load_patch_set(installed_sources())
    for p in ps.patches.values():
        assert f"## {p.id}\n" in pages["patches.md"]
        assert f"`{p.id}`" in pages["manifests.md"]
        for e in p.env_vars:
            assert f"`{e.name}`" in pages["env.md"]
    for k in KNOBS:
        assert f"`{k.name}`" in pages["env.md"]
