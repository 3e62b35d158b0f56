"""The two names parsed in one place (declaration/names.py): a target `module:Qualname` and a patch key
`id@version`; and no hand split of either growing back anywhere else in src/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_patchkit.declaration.names import PatchKey, Target

SRC = Path(__file__).resolve().parents[2] / "src" / "vllm_patchkit"


# -- Target ---------------------------------------------------------------------------------------
def test_a_member_target_parses_into_module_owner_and_attribute():
    t = Target.parse("vllm.v1.core.sched.scheduler:Scheduler._free_request")
    assert (t.module, t.qualname) == ("vllm.v1.core.sched.scheduler", "Scheduler._free_request")
    assert (t.owner, t.attr, t.is_member) == ("Scheduler", "_free_request", True)
    assert t.owner_target == Target("vllm.v1.core.sched.scheduler", "Scheduler")
    assert t.parts == ["Scheduler", "_free_request"]


def test_a_module_level_target_has_no_owner():
    t = Target.parse("vllm.model_executor.models.registry:_run")
    assert (t.owner, t.owner_target, t.attr, t.is_member) == (None, None, "_run", False)


def test_a_nested_member_is_owned_by_its_whole_parent():
    t = Target.parse("m:Outer.Inner.meth")
    assert (t.owner, t.attr, str(t.owner_target)) == ("Outer.Inner", "meth", "m:Outer.Inner")


@pytest.mark.parametrize("text", ["vllm.a.b:C.m", "m:f", "__main__:name", "pkg.mod:Cls.<locals>.f"])
def test_a_target_prints_the_string_it_was_parsed_from(text):
    t = Target.parse(text)
    assert str(t) == text == f"{t}"
    module, qualname = t  # unpacks like the partition it replaces
    assert f"{module}:{qualname}" == text


def test_parsing_is_cached():
    assert Target.parse("m:C.f") is Target.parse("m:C.f")


@pytest.mark.parametrize("text", ["vllm.a.b", "vllm.a.b:", ":C.m", "", "a:b:c"])
def test_a_malformed_target_is_refused_naming_the_string_and_the_form(text):
    with pytest.raises(ValueError) as exc:
        Target.parse(text)
    assert repr(text) in str(exc.value) and "module:Qualname" in str(exc.value)


# -- PatchKey -------------------------------------------------------------------------------------
def test_a_patch_key_parses_into_id_and_a_whole_version():
    k = PatchKey.parse("stats-scheduler@3")
    assert (k.id, k.version) == ("stats-scheduler", 3)
    assert str(k) == "stats-scheduler@3"
    assert PatchKey.parse("core.operator-endpoints@12") == ("core.operator-endpoints", 12)


@pytest.mark.parametrize("text", ["stats-scheduler", "stats-scheduler@", "@3", "x@v3", "x@3@4", "x@-1", "x@²"])
def test_a_malformed_patch_key_is_refused_naming_the_string_and_the_form(text):
    with pytest.raises(ValueError) as exc:
        PatchKey.parse(text)
    assert repr(text) in str(exc.value) and "id@version" in str(exc.value)


# -- no hand split grows back ---------------------------------------------------------------------
#: `.split(":")`, `.rpartition('@')`, `.rsplit(":", 1)`, ...: a string cut at `:` or `@` by hand.
HAND_SPLIT = re.compile(r"""\.r?(?:partition|split)\(\s*(["'])[:@]\1""")

#: Cuts at `:` of strings that are no target, each with why (path under src/vllm_patchkit, the code cut).
OTHER_SPLITS = {
    ("runtime/release.py", 'raw.partition(":")'): "the test seam's env value INSTALLED:REPORTED (two versions)",
    ("tools/scan/recall.py", 'where.rpartition(":")'): "a catalogue's `where`, a file:line",
    ("tools/scan/recall.py", 'src.split(":", 1)'): "a catalogue's `source`, `pypi:name==version`",
    ("upstream/static_lazy.py", 'path.partition(":")'): "vLLM's own lazy-export table values, `.module[:attr]` "
                                                         "(relative, the attribute optional): vLLM's form, not ours",
}

#: Owned by a concurrent change; converted at merge.
OWNED_ELSEWHERE = {

}


def _hand_splits() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == "declaration/names.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if HAND_SPLIT.search(line) and not line.lstrip().startswith("#"):
                found.append((rel, n, line.strip()))
    return found


def test_no_target_or_patch_key_is_split_by_hand_outside_names():
    """A target or a patch key is read with Target.parse / PatchKey.parse; a cut at `:` or `@` elsewhere is
    either listed in OTHER_SPLITS (it cuts something else) or a hand split grown back."""
    bad = [f"{rel}:{n}: {code}" for rel, n, code in _hand_splits()
           if rel not in OWNED_ELSEWHERE and not any(rel == p and cut in code for p, cut in OTHER_SPLITS)]
    assert bad == [], "split by hand (use vllm_patchkit.declaration.names):\n" + "\n".join(bad)


def test_every_listed_exception_still_exists():
    """An exception whose cut is gone is taken off the list, so the list never lets a new one through."""
    found = _hand_splits()
    stale = [key for key in OTHER_SPLITS if not any(rel == key[0] and key[1] in code for rel, _, code in found)]
    assert stale == []
    assert all((SRC / rel).exists() for rel in OWNED_ELSEWHERE)


def test_the_pattern_bites():
    for code in ['m, _, q = spec.partition(":")', "k.split('@')[0]", 'x.rsplit(":", 1)', 'a.rpartition("@")']:
        assert HAND_SPLIT.search(code), code
    for code in ['x.partition(" ")', 'spec.replace(":", ".")', 'q.rpartition(".")', '":" in spec']:
        assert not HAND_SPLIT.search(code), code
