"""Say what changed, precisely: the exact words `check` prints for each kind of drift.

Each case pins patches on a synthetic "before" tree (1.0.0) and checks an "after"
tree (2.0.0) statically (as a wheel or source tree is read) and, where the drift
is about what an import sees, live (the after tree imported, as the installed
vLLM is read): a parameter inserted in front of others (one positional shift,
not a "moved" line per parameter), a target that moved and changed on the way,
a method now inherited from a base class, and one breakage shared by several
patches (reported once, naming them all).
"""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import msgspec


from vllm_patchkit.tools import releases
from vllm_patchkit.tools.check import check
from vllm_patchkit.tools.render import render_github, render_json, render_text
from vllm_patchkit.upstream.findings import BreakageKind as K
from vllm_patchkit.upstream.sigdiff import diff_signatures
from vllm_patchkit.tools.static import StaticRelease

from .helpers import patch_doc


def _explain(report) -> list[tuple[str, str]]:
    return [(b.kind.value, b.explain()) for b in report.breakages]


def _forget_toy() -> None:
    for name in [m for m in sys.modules if m == "toy" or m.startswith("toy.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def live(monkeypatch):
    """A LiveRelease of a synthetic tree: imported from it, and its static view read from it."""
    def make(root, version: str = "2.0.0") -> releases.LiveRelease:
        _forget_toy()
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.setattr(releases, "installed_root", lambda: root)
        monkeypatch.setattr(releases, "installed_version", lambda: version)
        return releases.LiveRelease()

    yield make
    _forget_toy()


def _live_check(s, release):
    return check(release, s.patch_set, {"1.0.0": s.pinned.manifest})


# -- 1. a parameter inserted in front of existing ones ------------------------------------------
def step(sig: str) -> dict[str, str]:
    return {"toy/mod.py": f"class Runner:\n    def step{sig}:\n        pass\n"}


POOL_BEFORE = {"toy/kv.py": "def pool_bytes(kv_cache_groups):\n    pass\n"}
POOL_AFTER = {"toy/kv.py": "def pool_bytes(vllm_config, kv_cache_groups):\n    pass\n"}  # vLLM 0.32's change


def test_optional_parameter_inserted_is_a_positional_shift_not_a_compatible_addition(scenario):
    s = scenario(step("(self, batch, num_tokens=None)"), step("(self, batch, spec_tokens=None, num_tokens=None)"),
                 [patch_doc("p", "toy.mod:Runner.step")])
    assert _explain(s.check()) == [
        ("positional_shift", "toy.mod:Runner.step: parameter 'spec_tokens' inserted at position 2 before "
                             "'num_tokens': callers passing it positionally bind it to the wrong parameter")]
    # appended, the same parameter is the compatible addition it always was
    [b] = diff_signatures("p@1", "toy.mod:Runner.step", "(self, batch, num_tokens=None)",
                          "(self, batch, num_tokens=None, spec_tokens=None)")
    assert (b.kind, b.explain()) == (K.optional_parameter_added, "toy.mod:Runner.step: parameter 'spec_tokens' "
                                     "added (positional-or-keyword, position 3, default None)")


def test_required_parameter_inserted_first_shifts_every_parameter(scenario):
    s = scenario(POOL_BEFORE, POOL_AFTER, [patch_doc("p", "toy.kv:pool_bytes")])
    assert _explain(s.check()) == [
        ("positional_shift", "toy.kv:pool_bytes: parameter 'vllm_config' inserted at position 0 before "
                             "'kv_cache_groups': callers passing it positionally bind it to the wrong parameter"),
        ("required_parameter_added", "toy.kv:pool_bytes: required parameter 'vllm_config' added "
                                     "(positional-or-keyword, position 0): a call that does not pass it raises TypeError"),
    ]


def test_required_parameter_inserted_first_read_live(scenario, live):
    s = scenario(POOL_BEFORE, POOL_AFTER, [patch_doc("p", "toy.kv:pool_bytes")])
    assert _explain(_live_check(s, live(s.after))) == _explain(s.check())
    assert [b.kind for b in _live_check(s, live(s.after)).breakages] == [K.positional_shift, K.required_parameter_added]


@pytest.mark.parametrize("old, new, want", [
    ("(self, a, b, c)", "(self, x, a, b, c)",
     ["positional_shift: parameter 'x' inserted at position 1 before 'a', 'b', 'c': callers passing those "
      "positionally bind them to the wrong parameter",
      "required_parameter_added: required parameter 'x' added (positional-or-keyword, position 1): a call that "
      "does not pass it raises TypeError"]),
    ("(a, b)", "(x, y, a, b)",
     ["positional_shift: parameters 'x', 'y' inserted at positions 0-1 before 'a', 'b': callers passing those "
      "positionally bind them to the wrong parameter",
      "required_parameter_added: required parameter 'x' added (positional-or-keyword, position 0): a call that "
      "does not pass it raises TypeError",
      "required_parameter_added: required parameter 'y' added (positional-or-keyword, position 1): a call that "
      "does not pass it raises TypeError"]),
    # an insertion in front and a parameter moved to the end: 'b' and 'c' keep their positions (no "moved
    # from position 1 to 1"), 'a' moved, and nothing is shifted by the insertion that the move does not explain
    ("(a, b, c)", "(x, b, c, a)",
     ["required_parameter_added: required parameter 'x' added (positional-or-keyword, position 0): a call that "
      "does not pass it raises TypeError",
      "parameter_moved: parameter 'a' moved from position 0 to 3: positional calls bind it to another argument"]),
    # an insertion and a removal: only the parameters that changed position are named
    ("(a, b, c)", "(x, a, c)",
     ["parameter_removed: parameter 'b' removed (was positional-or-keyword, position 1): a call that passes it "
      "raises TypeError",
      "positional_shift: parameter 'x' inserted at position 0 before 'a': callers passing it positionally bind it "
      "to the wrong parameter",
      "required_parameter_added: required parameter 'x' added (positional-or-keyword, position 0): a call that "
      "does not pass it raises TypeError"]),
], ids=["three_shifted", "two_inserted", "inserted_and_moved", "inserted_and_removed"])
def test_insertion_is_one_finding_not_one_moved_line_per_parameter(old, new, want):
    got = [f"{b.kind.value}: {b.explain().partition(': ')[2]}" for b in diff_signatures("p@1", "m:f", old, new)]
    assert got == want


# -- 2. a target that moved, and changed on the way ---------------------------------------------
MOVE_BEFORE = {"toy/core/utils.py": "def get_configs(cfg, specs):\n    pass\n"}
MOVE_AFTER = {"toy/core/utils.py": "X = 1\n", "toy/core/planning.py": "def get_configs(cfg, groups, specs):\n    pass\n"}
AT_NEW_HOME = [
    ("positional_shift", "toy.core.planning:get_configs: parameter 'groups' inserted at position 1 before 'specs': "
                         "callers passing it positionally bind it to the wrong parameter"),
    ("required_parameter_added", "toy.core.planning:get_configs: required parameter 'groups' added "
                                 "(positional-or-keyword, position 1): a call that does not pass it raises TypeError"),
]


# the toy "before" tree is not a release check can open: a move is confirmed by its signature alone
# (tools/moved_identity.py), and the claim says so
BY_SIGNATURE = "; identity by signature alone: the pinned release's source is not at hand"


def test_moved_target_is_diffed_at_its_new_home(scenario):
    s = scenario(MOVE_BEFORE, MOVE_AFTER, [patch_doc("p", "toy.core.utils:get_configs")])
    assert _explain(s.check()) == [
        ("target_moved", "toy.core.utils:get_configs: target moved: now defined at toy.core.planning:get_configs "
                         "(module 'toy.core.utils' has no attribute 'get_configs'"
                         f"{BY_SIGNATURE})"),
        *AT_NEW_HOME,
    ]


def test_moved_target_is_diffed_at_its_new_home_live(scenario, live):
    s = scenario(MOVE_BEFORE, MOVE_AFTER, [patch_doc("p", "toy.core.utils:get_configs")])
    assert _explain(_live_check(s, live(s.after))) == [
        ("target_moved", "toy.core.utils:get_configs: target moved: now defined at toy.core.planning:get_configs "
                         "(toy.core.utils:get_configs: no attribute 'get_configs' (target moved or removed)"
                         f"{BY_SIGNATURE})"),
        *AT_NEW_HOME,
    ]


def test_moved_method_that_became_a_staticmethod(scenario):
    before = {"toy/runner.py": "class Runner:\n    def sample(self, logits):\n        pass\n"}
    after = {"toy/runner.py": "X = 1\n",
             "toy/sampling.py": "class Runner:\n    @staticmethod\n    def sample(logits):\n        pass\n"}
    s = scenario(before, after, [patch_doc("p", "toy.runner:Runner.sample")])
    assert _explain(s.check()) == [
        ("target_moved", "toy.runner:Runner.sample: target moved: now defined at toy.sampling:Runner.sample "
                         f"(module 'toy.runner' has no attribute 'Runner'{BY_SIGNATURE})"),
        ("kind_changed", "toy.sampling:Runner.sample: changed from a method to a staticmethod"),
    ]


# -- 3. a method now inherited from a base class ------------------------------------------------
INHERIT_BEFORE = {"toy/runner.py": "class Runner:\n    def step(self, batch):\n        pass\n"}


def inherit_after(base_sig: str = "(self, batch)") -> dict[str, str]:
    return {
        "toy/base.py": f"class BaseRunner:\n    def step{base_sig}:\n        pass\n",
        "toy/runner.py": "from toy.base import BaseRunner\n\nclass Runner(BaseRunner):\n    pass\n",
    }


INHERITED = ("target_inherited", "toy.runner:Runner.step: now inherited from toy.base:BaseRunner.step, no longer "
             "defined on Runner: a patch on Runner.step would add an override shadowing BaseRunner.step for Runner "
             "alone; a patch on BaseRunner.step alters every class inheriting it")


def test_inherited_method_is_reported_as_inherited(scenario, live):
    s = scenario(INHERIT_BEFORE, inherit_after(), [patch_doc("p", "toy.runner:Runner.step")])
    assert _explain(s.check()) == [INHERITED]
    assert _explain(_live_check(s, live(s.after))) == [INHERITED]


def test_inherited_method_that_changed_is_diffed_at_the_base(scenario, live):
    s = scenario(INHERIT_BEFORE, inherit_after("(self, batch, *, force=False)"),
                 [patch_doc("p", "toy.runner:Runner.step")])
    want = [INHERITED, ("optional_parameter_added",
                        "toy.base:BaseRunner.step: parameter 'force' added (keyword-only, default False)")]
    assert _explain(s.check()) == want
    assert _explain(_live_check(s, live(s.after))) == want


def test_inherited_through_two_levels_names_the_class_that_defines_it(scenario, live):
    after = {**inherit_after(), "toy/mid.py": "from toy.base import BaseRunner\n\nclass Mid(BaseRunner):\n    X = 1\n",
             "toy/runner.py": "from toy.mid import Mid\n\nclass Runner(Mid):\n    pass\n"}
    s = scenario(INHERIT_BEFORE, after, [patch_doc("p", "toy.runner:Runner.step")])
    assert _explain(s.check()) == [INHERITED]
    assert _explain(_live_check(s, live(s.after))) == [INHERITED]


def test_static_reader_says_inherited_not_moved(tmp_path):
    from .helpers import write_tree

    root = write_tree(tmp_path, inherit_after())
    got = StaticRelease.open(root).lookup("toy.runner:Runner.step")
    assert got.inherited_from == "toy.base:BaseRunner.step"
    assert got.reason == "'step' is inherited from toy.base:BaseRunner, not defined on Runner"


# -- 4. several patches on one target: each breakage once, naming every patch it affects --------
SHARED_BEFORE = {"toy/mod.py": "def f(a, query_start_loc=None):\n    pass\n\ndef g(x):\n    pass\n"}
SHARED_AFTER = {"toy/mod.py": "def f(a, query_start_loc):\n    pass\n\ndef g(x, y):\n    pass\n"}
# count-f and trace-f read query_start_loc (so its change breaks them); wrap-g is a verbatim passthrough
READS_LOC = {"implementation": "toy_impl:wrapper", "params": ["query_start_loc"]}
SHARED_PATCHES = [patch_doc("count-f", "toy.mod:f", **READS_LOC), patch_doc("trace-f", "toy.mod:f", **READS_LOC),
                  patch_doc("wrap-g", "toy.mod:g")]
BREAKS = "breaking: the implementation reads 'query_start_loc' (declared in params)"
SURVIVES = "compatible: verbatim passthrough: args and kwargs reach upstream untouched"
NOW_REQUIRED = "toy.mod:f: parameter 'query_start_loc' is now required (its default None was removed)"
G_ADDED = ("toy.mod:g: required parameter 'y' added (positional-or-keyword, position 1): "
           "a call that does not pass it raises TypeError")


def test_text_reports_a_shared_breakage_once_per_target(scenario):
    s = scenario(SHARED_BEFORE, SHARED_AFTER, SHARED_PATCHES)
    report = s.check()
    assert render_text(report) == (
        f"vllm-patchkit check: vLLM 2.0.0 (static, {s.after})\n"
        "  BROKEN    count-f@1 (pins of vLLM 1.0.0)\n"
        "  BROKEN    trace-f@1 (pins of vLLM 1.0.0)\n"
        "  carry     wrap-g@1 (pins of vLLM 1.0.0)\n"
        "            note: changes this patch survives: `vllm-patchkit pin` carries it forward\n"
        "breakages, by target:\n"
        f"  - [parameter_now_required] {NOW_REQUIRED} — affects count-f@1, trace-f@1 ({BREAKS})\n"
        "compatible changes (the patches survive them):\n"  # not a breakage: not under that heading (issue 31)
        f"  - [required_parameter_added] {G_ADDED} — affects wrap-g@1 ({SURVIVES})\n"
        "0 ok, 1 compatible, 0 stale, 2 broken, 0 unpinned, 0 not applicable, 0 retirable on vLLM 2.0.0\n")
    assert report.exit_code() == 1
    assert [(f.target, f.patches) for f in report.findings()] == [
        ("toy.mod:f", ("count-f@1", "trace-f@1")), ("toy.mod:g", ("wrap-g@1",))]


def test_json_reports_a_shared_breakage_once_per_target(scenario):
    s = scenario(SHARED_BEFORE, SHARED_AFTER, SHARED_PATCHES)
    doc = json.loads(render_json(s.check()))
    assert doc["ok"] is False
    assert doc["breakages"] == [
        {"kind": "parameter_now_required", "target": "toy.mod:f", "parameter": "query_start_loc", "old": "None",
         "new": None, "explain": NOW_REQUIRED, "breaking": True, "compat": BREAKS.partition(": ")[2],
         "patches": ["count-f@1", "trace-f@1"]},
        {"kind": "required_parameter_added", "target": "toy.mod:g", "parameter": "y", "old": None,
         "new": "positional-or-keyword, position 1", "explain": G_ADDED, "breaking": False,
         "compat": SURVIVES.partition(": ")[2], "patches": ["wrap-g@1"]},
    ]


def test_github_reports_a_shared_breakage_once_per_target(scenario):
    s = scenario(SHARED_BEFORE, SHARED_AFTER, SHARED_PATCHES)
    lines = render_github(s.check()).splitlines()
    [f_err] = [line for line in lines if line.startswith("::error")]
    assert "count-f-1.yaml,title=count-f@1%2C trace-f@1 break on vLLM 2.0.0 (parameter_now_required)::" in f_err
    assert f_err.endswith(f"::{NOW_REQUIRED}")
    [g_note] = [line for line in lines if line.startswith("::notice")]
    assert "wrap-g-1.yaml,title=wrap-g@1%3A compatible change on vLLM 2.0.0 (required_parameter_added)::" in g_note


def test_patches_pinned_differently_on_one_target_get_their_own_findings(scenario):
    """Grouped only when the finding is the same: a patch pinned on another signature has its own line."""
    s = scenario(SHARED_BEFORE, SHARED_AFTER, SHARED_PATCHES)
    entry = next(e for e in s.pinned.manifest.patches if e.patch == "trace-f@1")
    entry.targets["toy.mod:f"] = msgspec.structs.replace(entry.targets["toy.mod:f"], signature="(a, query_start_loc=0)")
    lines = [line for line in render_text(s.check()).splitlines() if line.startswith("  - [")]
    assert lines[:2] == [
        f"  - [parameter_now_required] {NOW_REQUIRED} — affects count-f@1 ({BREAKS})",
        "  - [parameter_now_required] toy.mod:f: parameter 'query_start_loc' is now required (its default 0 was "
        f"removed) — affects trace-f@1 ({BREAKS})",
    ]
