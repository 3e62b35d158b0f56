"""Declarations are bounded before they are expanded (issue 33, item 3).

Before: a few hundred bytes of nested YAML anchors and aliases (9 levels of 9: 9**9 strings expanded) as a `set`
patch's `value` passed validation, and the start-up cache's JSON writer then walked the expansion (4 GiB, > 30 s,
no message); in a string field the error message's repr of the input took 42 s and 3.4 GiB (`check` the same);
a 4.18 MB map in an unknown key took 32 s and 927 MiB. Each bomb here is built by the test (none is committed),
and each is refused by a bound checked on the composed YAML nodes, before any value is built: the assertions
are on the message of that bound (how long it takes is benchmarks/declaration_bounds.py's business).
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration import yaml_bounds
from vllm_patchkit.declaration.declare import load_patch_set
from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.yaml_files import validation_errors

HEAD = """\
id: bomb
version: 1
summary: {summary}
why: hostile input
upstream: "none: test"
retire_when: {{manual: test}}
required: false
kind: set
target: vllm.v1.core.sched.scheduler:Scheduler.patchkit_test_value
processes: [frontend]
"""
EXPANDED = "values once its aliases are expanded"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A flow list whose last item stands for width**levels strings (~0.5 kB of YAML)."""
    items = ["&l0 [" + ", ".join(["lol"] * width) + "]"]
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def _folder(tmp_path, text: str):
    folder = tmp_path / "patches"
    folder.mkdir(exist_ok=True)
    (folder / "bomb.yaml").write_text(text)
    return folder, folder / "bomb.yaml"


def _refused(folder) -> list[DeclarationError]:
    with pytest.raises((DeclarationError, PatchSetErrors)) as ei:
        load_patch_set([folder])
    return ei.value.errors if isinstance(ei.value, PatchSetErrors) else [ei.value]


def test_alias_bomb_in_a_set_value_is_refused_at_parse(tmp_path):
    folder, path = _folder(tmp_path, HEAD.format(summary="s") + f"value: {alias_bomb()}\n")
    [err] = _refused(folder)
    assert err.file == str(path) and err.field.startswith("value[")
    assert EXPANDED in err.problem and f"{yaml_bounds.MAX_NODES:,}" in err.problem


def test_alias_bomb_at_start_up_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    """The plugin's own path: the folder as an extra patch set, the start-up cache on."""
    from vllm_patchkit.runtime.loader import Loader

    folder, path = _folder(tmp_path, HEAD.format(summary="s") + f"value: {alias_bomb()}\n")
    cache = tmp_path / "cache"
    monkeypatch.setenv("VLLM_PATCHKIT_EXTRA_PATCHES", str(folder))
    monkeypatch.setenv("VLLM_PATCHKIT_CACHE_DIR", str(cache))
    with pytest.raises((DeclarationError, PatchSetErrors)) as ei:
        Loader.builtin(role="frontend", status_dir=tmp_path / "status")
    text = str(ei.value)
    assert f"{path}: value[" in text and EXPANDED in text
    assert not list(cache.glob("patchsets-*.json")) if cache.exists() else True


def test_alias_bomb_in_a_string_field_is_refused_before_its_repr(tmp_path):
    folder, path = _folder(tmp_path, HEAD.format(summary=alias_bomb()) + "value: 1\n")
    [err] = _refused(folder)
    assert err.file == str(path) and err.field.startswith("summary[") and EXPANDED in err.problem


def test_check_refuses_the_bomb_naming_file_and_field(tmp_path, capsys):
    from vllm_patchkit.tools.cli import main

    folder, path = _folder(tmp_path, HEAD.format(summary=alias_bomb()) + "value: 1\n")
    (tmp_path / "manifests").mkdir()
    assert main(["check", "--patch-dir", str(folder), "--manifest-dir", str(tmp_path / "manifests")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: summary[" in err and EXPANDED in err


def test_big_map_in_an_unknown_key_is_refused_while_read(tmp_path):
    """Before: a 4.18 MB map in an unknown key took 32 s (PyYAML reads ~10,000 values a second): now reading stops
    at the bound on values per file, naming the field it was in."""
    entries = "".join(f"  key{i:07d}: v\n" for i in range(4_180_000 // 16))
    folder, path = _folder(tmp_path, HEAD.format(summary="s") + "value: 1\nextra_stuff:\n" + entries)
    [err] = _refused(folder)
    assert err.file == str(path) and err.field.startswith("extra_stuff")
    assert f"more than {yaml_bounds.MAX_COMPOSED:,} values in one file" in err.problem


def test_long_list_is_refused_by_its_entries(tmp_path):
    folder, path = _folder(tmp_path, HEAD.format(summary="s") + "value: [" + "1, " * yaml_bounds.MAX_ENTRIES + "1]\n")
    [err] = _refused(folder)
    assert (err.file, err.field) == (str(path), "value")
    assert f"{yaml_bounds.MAX_ENTRIES + 1:,} entries in one list" in err.problem


def test_too_many_aliases_are_refused_while_composing(tmp_path):
    aliases = ", ".join(["*a"] * (yaml_bounds.MAX_ALIASES + 1))
    folder, path = _folder(tmp_path, HEAD.format(summary="s") + f"base: &a x\nvalue: [{aliases}]\n")
    [err] = _refused(folder)
    assert (err.file, err.field) == (str(path), f"value[{yaml_bounds.MAX_ALIASES}]")
    assert f"more than {yaml_bounds.MAX_ALIASES:,} aliases" in err.problem


def test_long_string_is_refused_naming_the_field(tmp_path):
    folder, path = _folder(tmp_path, HEAD.format(summary="s") + "value: " + "x" * (yaml_bounds.MAX_CHARS + 1) + "\n")
    [err] = _refused(folder)
    assert (err.file, err.field) == (str(path), "value") and "characters" in err.problem


def test_recursive_alias_is_refused(tmp_path):
    folder, path = _folder(tmp_path, HEAD.format(summary="s") + "value: &a [1, *a]\n")
    [err] = _refused(folder)
    assert (err.file, err.field) == (str(path), "value[1]") and "contains itself" in err.problem


def test_aliases_within_the_bounds_still_read(tmp_path):
    """An anchor reused a few times (YAML's own feature) is fine: the bounds are on size, not on aliases."""
    folder, _ = _folder(tmp_path, HEAD.format(summary="s") + f"value: {alias_bomb(levels=3, width=4)}\n")
    ps = load_patch_set([folder])
    [patch] = ps.patches.values()
    assert patch.value[2] == [[["lol"] * 4] * 4] * 4


def test_error_message_repr_is_bounded():
    """The `(got ...)` of a validation error is built with a bounded repr: an item nested deeper than it shows is
    never repr'd (before: `repr(input)` in full, then cut to 80 characters)."""
    from pydantic import BaseModel, ValidationError

    class Boom:
        def __repr__(self):
            raise AssertionError("the whole input was repr'd")

    class M(BaseModel):
        summary: str

    with pytest.raises(ValidationError) as ei:
        M.model_validate({"summary": [[[[[[Boom()]]]]], *range(1000)]})
    [err] = validation_errors("p.yaml", ei.value, M)
    assert err.field == "summary" and "(got [[[" in err.problem and len(err.problem) < 200
