"""`check` and `pin` report an implementation the loader cannot import (issue 21, item 8).

Before: an implementation module not found on this Python's path was left to start-up ("not installed where
`check` runs"): `check` said ok and `pin` pinned, and the loader then refused the patch (`implementation`).
Now, for a patch set installed where they run (an installed set, or a folder on the path), it is a breaking
`implementation_unimportable` finding naming the module and the path searched; one that does not parse or lacks
the name is the same finding (it was a `convention_mismatch` before). A loose folder of patches that is not on
the path is still left to start-up: its modules may well be installed where it serves.
"""

from __future__ import annotations

import sys

import pytest
import yaml

from vllm_patchkit.tools.cli import main
from vllm_patchkit.upstream import impl_static

from .helpers import patch_doc, write_patches, write_tree

TREE = {"toy/mod.py": "def f(a):\n    pass\n"}


def _cli(verb, tree, patches, manifests, *extra):
    return main([verb, "--source", str(tree), "--vllm", "1.0.0", "--patch-dir", str(patches),
                 "--manifest-dir", str(manifests), *extra])


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path holding the patch set `myset` (its YAML and its implementation modules)."""
    root = tmp_path / "site"
    (root / "myset").mkdir(parents=True)
    (root / "myset" / "__init__.py").write_text("")
    (root / "myset" / "good.py").write_text("def wrap(wrapped, instance, args, kwargs):\n"
                                            "    return wrapped(*args, **kwargs)\n")
    (root / "myset" / "broken.py").write_text("def wrap(wrapped, instance, args, kwargs:\n")
    monkeypatch.syspath_prepend(str(root))
    impl_static.clear_cache()
    yield root
    for name in [m for m in sys.modules if m == "myset" or m.startswith("myset.")]:
        sys.modules.pop(name, None)


def _setup(tmp_path, patches_dir, implementation, required=False):
    tree = write_tree(tmp_path / "tree", TREE)
    patches = write_patches(patches_dir, [patch_doc("p", "toy.mod:f", implementation=implementation,
                                                    required=required)])
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "vllm-1.0.0.yaml").write_text(yaml.safe_dump({
        "vllm": "1.0.0", "generated_by": "test",
        "patches": [{"patch": "p@1", "targets": {"toy.mod:f": {"kind": "function", "signature": "(a)"}}}]}))
    return tree, patches, manifests


@pytest.mark.parametrize("implementation, words", [
    ("myset.gone:wrap", "implementation module myset.gone cannot be read: no module named 'myset.gone' on this "
                        "Python's path (searched the folders of package myset: {site}/myset)"),
    ("gone_everywhere.impl:wrap", "implementation module gone_everywhere.impl cannot be read: no module named "
                                  "'gone_everywhere' on this Python's path (searched sys.path: {site}"),
    ("myset.broken:wrap", "implementation module myset.broken cannot be read: SyntaxError"),
    ("myset.good:nope", "implementation myset.good:nope cannot be read: {site}/myset/good.py defines no 'nope'"),
], ids=["submodule-missing", "package-missing", "does-not-parse", "name-missing"])
def test_check_reports_an_implementation_the_loader_cannot_import(tmp_path, site, capsys, implementation, words):
    tree, patches, manifests = _setup(tmp_path, site / "myset" / "patches", implementation)
    assert _cli("check", tree, patches, manifests) == 1
    out = capsys.readouterr().out
    assert "[implementation_unimportable] toy.mod:f: the implementation cannot be imported: " in out, out
    assert words.format(site=site) in out, out
    assert "the loader refuses the patch at start-up (`implementation`)" in out


def test_an_importable_implementation_is_ok(tmp_path, site, capsys):
    tree, patches, manifests = _setup(tmp_path, site / "myset" / "patches", "myset.good:wrap")
    assert _cli("check", tree, patches, manifests) == 0, capsys.readouterr().out


def test_pin_does_not_pin_what_the_loader_would_refuse(tmp_path, site, capsys):
    tree, patches, manifests = _setup(tmp_path, site / "myset" / "patches", "myset.gone:wrap", required=True)
    (manifests / "vllm-1.0.0.yaml").unlink()
    assert _cli("pin", tree, patches, manifests) == 1
    err = capsys.readouterr().err
    assert "p@1 (required) does not fit vLLM 1.0.0" in err and "no module named 'myset.gone'" in err, err
    assert not (manifests / "vllm-1.0.0.yaml").exists()


def test_a_loose_folder_not_on_the_path_is_left_to_start_up(tmp_path, capsys):
    """Patches read from a folder that is not installed here: their implementation modules may be installed
    where they serve, so check does not judge their presence (it does judge what it can read)."""
    tree, patches, manifests = _setup(tmp_path, tmp_path / "loose" / "patches", "not_installed_here.impl:wrap")
    assert _cli("check", tree, patches, manifests) == 0, capsys.readouterr().out
