"""Every breakage class, from a small synthetic before/after source tree.

Each case pins a patch on the "before" tree (1.0.0) and checks the "after" tree
(2.0.0) statically: the finding's kind, where it is, and that its explanation
names what changed at the parameter level.
"""

from __future__ import annotations

import pytest

from vllm_patchkit.upstream.findings import BreakageKind as K

from vllm_patchkit.declaration.declare import load_patch_set

from .helpers import Scenario, patch_doc, write_patches

F = "toy.mod:f"
M = "toy.mod:Runner.step"
MOD_BEFORE = "def other():\n    pass\n\n"


def fn(sig: str, body: str = "pass") -> dict[str, str]:
    return {"toy/mod.py": f"{MOD_BEFORE}def f{sig}:\n    {body}\n"}


def method(decorator: str, sig: str) -> dict[str, str]:
    return {"toy/mod.py": f"class Runner:\n    {decorator}\n    def step{sig}:\n        pass\n"}


# (case id, before tree, after tree, patch kind, expected kinds, text the explanation must contain)
SIGNATURE_CASES = [
    ("required_parameter_added", fn("(a, b)"), fn("(a, b, c)"), [K.required_parameter_added],
     "required parameter 'c' added (positional-or-keyword, position 2)"),  # appended; inserted: test_drift_wording.py
    ("optional_parameter_added", fn("(a)"), fn("(a, b=None)"), [K.optional_parameter_added],
     "parameter 'b' added (positional-or-keyword, position 1, default None)"),
    ("parameter_removed", fn("(kv_cache_groups, block_size)"), fn("(kv_cache_groups)"), [K.parameter_removed],
     "parameter 'block_size' removed (was positional-or-keyword, position 1)"),
    ("parameter_renamed", fn("(idx, sampled_tokens, query_start_loc=None)"), fn("(idx, tokens, query_start_loc=None)"),
     [K.parameter_renamed], "parameter 'sampled_tokens' renamed to 'tokens'"),
    ("parameter_reordered", fn("(a, b, c)"), fn("(a, c, b)"), [K.parameter_moved, K.parameter_moved],
     "parameter 'b' moved from position 1 to 2"),
    ("positional_to_keyword_only", fn("(a, b=1)"), fn("(a, *, b=1)"), [K.parameter_kind_changed],
     "parameter 'b' changed kind: positional-or-keyword -> keyword-only"),
    ("positional_only", fn("(a, b)"), fn("(a, /, b)"), [K.parameter_kind_changed],
     "parameter 'a' changed kind: positional-or-keyword -> positional-only"),
    ("default_removed", fn("(a, query_start_loc=None)"), fn("(a, query_start_loc)"), [K.parameter_now_required],
     "parameter 'query_start_loc' is now required (its default None was removed)"),
    ("default_added", fn("(a, use_cascade_attn)"), fn("(a, use_cascade_attn=False)"), [K.parameter_now_optional],
     "parameter 'use_cascade_attn' now has a default (False)"),
    ("default_changed", fn("(a, b=1)"), fn("(a, b=2)"), [K.default_changed], "default of 'b' changed: 1 -> 2"),
    ("kwargs_added", fn("(a)"), fn("(a, **kwargs)"), [K.optional_parameter_added], "parameter 'kwargs' added (var-keyword)"),
    ("keyword_only_reordered", fn("(*, a, b)"), fn("(*, b, a)"), [K.signature_changed],
     "signature changed: (*, a, b) -> (*, b, a)"),
]


@pytest.mark.parametrize("before, after, kinds, text", [c[1:] for c in SIGNATURE_CASES], ids=[c[0] for c in SIGNATURE_CASES])
def test_signature_breakages(scenario, before, after, kinds, text):
    s = scenario(before, after, [patch_doc("p", F), patch_doc("r", F, kind="replace")])
    report = s.check()
    by = {r.patch: r for r in report.results}
    found = by["p@1"].breakages
    assert [b.kind for b in found] == kinds, [b.explain() for b in found]
    assert all(b.target == F and b.patch == "p@1" for b in found)
    assert any(text in b.explain() for b in found), [b.explain() for b in found]
    # judged per patch: a verbatim passthrough survives every parameter-level change (not an unparsed one),
    # a replace (it stands in the target's place) survives none
    parsed = kinds != [K.signature_changed]
    assert by["p@1"].status == ("compatible" if parsed else "broken"), [b.verdict() for b in found]
    assert all(b.breaking is not parsed for b in found)
    assert set(kinds) <= {b.kind for b in by["r@1"].breakages}
    assert by["r@1"].status == "broken" and all(b.breaking for b in by["r@1"].breakages)
    assert report.exit_code() == 1


def test_unchanged_target_is_ok(scenario):
    s = scenario(fn("(a, b=1)", "return a"), fn("(a, b=1)", "return a + b  # body changes do not matter to a wrap"),
                 [patch_doc("p", F)])
    report = s.check()
    assert report.breakages == [] and report.results[0].status == "ok" and report.exit_code() == 0


def test_method_became_staticmethod(scenario):
    s = scenario(method("", "(self, x)"), method("@staticmethod", "(x)"), [patch_doc("p", M)])
    [b] = s.check().breakages
    assert b.kind is K.kind_changed
    assert b.explain() == "toy.mod:Runner.step: changed from a method to a staticmethod"


def test_target_removed(scenario):
    s = scenario(fn("(a)"), {"toy/mod.py": MOD_BEFORE}, [patch_doc("p", F)])
    [b] = s.check().breakages
    assert b.kind is K.target_removed
    assert "module 'toy.mod' has no attribute 'f'" in b.explain()


def test_module_removed(scenario):
    s = scenario({**fn("(a)"), "toy/keep.py": "x = 1\n"}, {"toy/keep.py": "x = 1\n"}, [patch_doc("p", F)])
    [b] = s.check().breakages
    assert b.kind is K.target_removed and "module 'toy.mod' is not in this release" in b.explain()


def test_method_moved_to_another_module(scenario):
    """The class moved to a sub-package: the old place is gone, the new one is named."""
    before = {"toy/runner.py": "class Runner:\n    def step(self, batch):\n        pass\n", "toy/engine/__init__.py": ""}
    after = {"toy/engine/runner.py": "class Runner:\n    def step(self, batch):\n        pass\n"}
    s = scenario(before, after, [patch_doc("p", "toy.runner:Runner.step")])
    [b] = s.check().breakages
    assert b.kind is K.target_moved
    assert b.new == "toy.engine.runner:Runner.step"
    assert "target moved: now defined at toy.engine.runner:Runner.step" in b.explain()
    assert "module 'toy.runner' is not in this release" in b.explain()


def test_method_moved_to_a_base_class_in_another_module(scenario):
    """Still reachable on Runner, through its base: inherited, not moved (wording: test_drift_wording.py)."""
    before = {"toy/runner.py": "class Runner:\n    def step(self):\n        pass\n"}
    after = {
        "toy/base.py": "class BaseRunner:\n    def step(self):\n        pass\n",
        "toy/runner.py": "from toy.base import BaseRunner\n\nclass Runner(BaseRunner):\n    pass\n",
    }
    s = scenario(before, after, [patch_doc("p", "toy.runner:Runner.step")])
    [b] = s.check().breakages
    assert b.kind is K.target_inherited and b.new == "toy.base:BaseRunner.step"
    assert b.detail == "'step' is inherited from toy.base:BaseRunner, not defined on Runner"


def test_function_moved_to_a_sibling_module(scenario):
    """vLLM 0.33 moved get_kv_cache_configs from kv_cache_utils to kv_cache_planning."""
    before = {"toy/core/utils.py": "def get_configs(cfg, specs):\n    pass\n"}
    after = {"toy/core/utils.py": "X = 1\n", "toy/core/planning.py": "def get_configs(cfg, specs, groups):\n    pass\n"}
    s = scenario(before, after, [patch_doc("p", "toy.core.utils:get_configs")])
    moved, added = s.check().breakages  # the move, and the parameter it gained on the way, at its new home
    assert moved.kind is K.target_moved and moved.new == "toy.core.planning:get_configs"
    assert (added.kind, added.target, added.parameter) == \
        (K.required_parameter_added, "toy.core.planning:get_configs", "groups")


COPY_BEFORE = {
    "toy/utils.py": "def helper(cfg, specs):\n    pass\n",
    "toy/engine.py": "from toy.utils import helper\n\ndef run():\n    return helper(1, 2)\n",
}


def test_function_imported_by_value_is_followed(scenario):
    """EngineCore's `from ... import get_kv_cache_configs`: the copy resolves to the same definition."""
    s = scenario(COPY_BEFORE, COPY_BEFORE, [patch_doc("p", "toy.utils:helper", copies=["toy.engine:helper"])])
    pins = s.pinned.manifest.patches[0].targets
    assert pins["toy.engine:helper"] == pins["toy.utils:helper"]
    assert pins["toy.engine:helper"].signature == "(cfg, specs)"
    assert s.check().breakages == []


def test_copy_follows_a_changed_function(scenario):
    after = {**COPY_BEFORE, "toy/utils.py": "def helper(cfg, specs, groups):\n    pass\n"}
    s = scenario(COPY_BEFORE, after, [patch_doc("p", "toy.utils:helper", copies=["toy.engine:helper"])])
    found = {(b.target, b.kind) for b in s.check().breakages}
    assert found == {("toy.utils:helper", K.required_parameter_added), ("toy.engine:helper", K.required_parameter_added)}


def test_copy_location_gone(scenario):
    after = {**COPY_BEFORE, "toy/engine.py": "def run():\n    return None\n"}
    s = scenario(COPY_BEFORE, after, [patch_doc("p", "toy.utils:helper", copies=["toy.engine:helper"])])
    [b] = s.check().breakages
    assert b.kind is K.copy_gone and b.target == "toy.engine:helper"
    assert b.explain() == "toy.engine:helper: copy location gone: module 'toy.engine' has no attribute 'helper'"


def test_copy_holds_another_function(scenario):
    after = {**COPY_BEFORE, "toy/engine.py": "def helper(cfg, specs):\n    return 0\n"}
    s = scenario(COPY_BEFORE, after, [patch_doc("p", "toy.utils:helper", copies=["toy.engine:helper"])])
    [b] = s.check().breakages
    assert b.kind is K.copy_differs
    assert "it holds toy.engine:helper, the target is toy.utils:helper" in b.explain()


def test_copy_through_a_relative_import_and_alias(scenario):
    tree = {
        "toy/core/utils.py": "def helper(cfg):\n    pass\n",
        "toy/core/engine.py": "from .utils import helper as _h\nhelper = _h\n",
    }
    s = scenario(tree, tree, [patch_doc("p", "toy.core.utils:helper",
                                        copies=["toy.core.engine:_h", "toy.core.engine:helper"])])
    assert s.check().breakages == []
    # both names hold it by value (the loader's stale search finds each): declaring one is not enough
    t = Scenario(s.before.parent / "one", tree, tree, [])
    one = patch_doc("p", "toy.core.utils:helper", copies=["toy.core.engine:helper"])
    from vllm_patchkit.tools.examine import examine

    from .helpers import release
    patch = load_patch_set([write_patches(t.patch_dir.parent / "p1", [one])]).patches["p@1"]
    _, found = examine(release(t.before, "1.0.0"), patch, None)
    assert [(b.kind, b.new) for b in found] == [(K.copy_undeclared, "toy.core.engine:_h")]


def test_source_changed_for_a_replace(scenario):
    s = scenario(fn("(a)", "return a"), fn("(a)", "return a + 1"), [patch_doc("p", F, kind="replace")])
    assert s.pinned.manifest.patches[0].targets[F].source_digest.startswith("sha256:")
    [b] = s.check().breakages
    assert b.kind is K.source_changed and "must be re-synced" in b.explain()


def test_decorator_layer_added(scenario):
    deco = ("import functools\n\ndef traced(fn):\n    @functools.wraps(fn)\n    def inner(*a, **k):\n"
            "        return fn(*a, **k)\n    return inner\n\n")
    before = {"toy/mod.py": "def f(a):\n    pass\n"}
    after = {"toy/mod.py": deco + "@traced\ndef f(a):\n    pass\n"}
    s = scenario(before, after, [patch_doc("p", F)])
    [b] = s.check().breakages
    assert b.kind is K.wrappers_changed
    assert b.explain() == "toy.mod:f: decorator layers changed: [] -> ['toy.mod.f']"


def test_target_defined_outside_the_release(scenario):
    s = scenario(fn("(a)"), {"toy/mod.py": "from json import dumps as f\n"}, [patch_doc("p", F)])
    [b] = s.check().breakages
    assert b.kind is K.target_unreadable and "defined outside the release (json:dumps)" in b.explain()


def test_unpinned_patch(scenario):
    s = scenario(fn("(a)"), fn("(a)"), [patch_doc("p", F)])
    s.pinned.manifest.patches.clear()  # as if the patch was added after the manifest was pinned
    res = s.check().results[0]
    assert res.status == "unpinned" and [b.kind for b in res.breakages] == [K.unpinned]


def test_every_kind_has_a_case():
    """Each BreakageKind is produced by a test in this folder (the list guards new kinds)."""
    covered = {k for c in SIGNATURE_CASES for k in c[3]} | {
        K.kind_changed, K.target_removed, K.target_moved, K.target_unreadable, K.source_changed,
        K.wrappers_changed, K.copy_gone, K.copy_differs, K.unpinned,
        K.probe_error,  # test_retire.py
        K.required_not_applicable,  # test_check_required_na.py
        K.value_changed, K.convention_mismatch,
        K.positional_shift, K.target_inherited,  # test_drift_wording.py
        K.copy_undeclared, K.misdeclared,  # test_one_verdict.py (real vLLM places)
        K.when_excludes, K.implementation_unimportable,  # test_contradictions.py, test_impl_unimportable.py
        K.foreign_replacement,  # tests/framework/test_foreign_replacement.py (check --live)
        K.unreviewed,  # test_unreviewed.py (drafts, placeholders, stubs)
        K.reach_missing,  # test_reach.py (a copy of vLLM 0.31.0 with one attribute renamed)
        K.name_collision,  # tests/framework/test_added_names.py (set + adds, real EngineCore, the 0.32.0 wheel)
        K.return_shape_changed,  # test_return_shape.py (a copy of vLLM 0.31.0 with a returned tuple grown)
        K.entry_collision, K.entry_gone, K.entry_unreadable,  # tests/framework/test_registry_entries.py (register)
    }
    assert covered == set(K)


@pytest.mark.skipif("uses" not in __import__("vllm_patchkit.declaration.schema", fromlist=["Patch"]).Patch.__struct_fields__,
                    reason="the patch schema has no `uses` field")
def test_a_used_callable_is_checked_like_a_target_not_like_a_copy(scenario):
    """`uses`: upstream functions the implementation calls (the KV hook calls vLLM's auto-fit)."""
    before = {"toy/utils.py": "def sizing(cfg):\n    pass\n\ndef auto_fit(cfg, groups, memory):\n    pass\n"}
    after = {"toy/utils.py": "def sizing(cfg):\n    pass\n\ndef auto_fit(cfg, groups):\n    pass\n"}
    s = scenario(before, after, [patch_doc("p", "toy.utils:sizing", uses=["toy.utils:auto_fit"])])
    assert set(s.pinned.manifest.patches[0].targets) == {"toy.utils:sizing", "toy.utils:auto_fit"}
    [b] = s.check().breakages  # no copy_differs: a used function is not a copy of the target
    assert b.kind is K.parameter_removed and b.target == "toy.utils:auto_fit" and b.parameter == "memory"


def test_constant_value_changed(scenario):
    """Pinning a constant records a digest of its value: a changed value is found, not only a removal."""
    s = scenario({"toy/mod.py": "LIMIT = 8\n"}, {"toy/mod.py": "LIMIT = 16\n"},
                 [patch_doc("p", "toy.mod:LIMIT", kind="set", value=4)])
    pin = s.pinned.manifest.patches[0].targets["toy.mod:LIMIT"]
    assert pin.kind == "attribute" and pin.value_digest.startswith("sha256:")
    [b] = s.check().breakages
    assert b.kind is K.value_changed
    assert b.explain().startswith("toy.mod:LIMIT: value changed since it was pinned (digest sha256:")


def test_implementation_that_rejects_a_call_the_release_makes(scenario, tmp_path, monkeypatch):
    """`check` judges the implementation against the release's signature, as start-up does: the seed's
    real bug (a postprocess_sampled replacement that renamed sampled_tokens) on a synthetic tree."""
    (tmp_path / "toy_wrapper.py").write_text(
        "def post(self, idx_mapping, tokens, num_sampled, num_rejected, query_start_loc):\n"
        "    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tree = {"toy/runner.py": "class Runner:\n    def post(self, idx_mapping, sampled_tokens, num_sampled, "
                             "num_rejected, query_start_loc=None):\n        pass\n"}
    s = scenario(tree, tree, [patch_doc("p", "toy.runner:Runner.post", kind="replace",
                                        implementation="toy_wrapper:post")])
    found = [b for b in s.check().breakages if b.kind is K.convention_mismatch]
    assert {b.parameter for b in found} >= {"sampled_tokens", "query_start_loc"}
    assert any("renamed parameter 'sampled_tokens' to 'tokens'" in b.explain() for b in found)


def test_declared_param_the_release_renamed(scenario, tmp_path, monkeypatch):
    """A wrap's `params` are judged against the release's signature: a renamed one is a convention breakage."""
    (tmp_path / "toy_reader.py").write_text(
        "def post(wrapped, instance, args, kwargs, ctx):\n    return wrapped(*args, **kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    old = {"toy/runner.py": "class Runner:\n    def post(self, sampled_tokens):\n        pass\n"}
    new = {"toy/runner.py": "class Runner:\n    def post(self, tokens):\n        pass\n"}
    s = scenario(old, new, [patch_doc("p", "toy.runner:Runner.post", implementation="toy_reader:post",
                                      params=["sampled_tokens"])])
    found = [b for b in s.check().breakages if b.kind is K.convention_mismatch]
    assert [(b.parameter, b.new) for b in found] == [("sampled_tokens", "unknown_param")]


def test_a_new_by_value_copy_of_the_target_is_copy_undeclared(scenario):
    """A release that adds `from toy.mod import f` somewhere: calls through that module bypass a patch on
    toy.mod:f (the loader's stale_copy); `check` finds it statically, breaking, naming the module."""
    before = {"toy/mod.py": "def f(a):\n    pass\n", "toy/user.py": "import toy.mod\n"}
    after = {"toy/mod.py": "def f(a):\n    pass\n", "toy/user.py": "from toy.mod import f\n\ndef g():\n    return f(1)\n",
             "toy/local.py": "def h():\n    from toy.mod import f\n    return f(2)\n"}
    s = scenario(before, after, [patch_doc("p", F)])
    [b] = s.check().breakages
    assert b.kind is K.copy_undeclared and b.new == "toy.user:f" and b.breaking
    assert "toy.user:f holds the target by value and is not declared in `copies`" in b.explain()


def test_a_declared_copy_is_not_copy_undeclared(scenario):
    after = {"toy/mod.py": "def f(a):\n    pass\n", "toy/user.py": "from toy.mod import f\n"}
    s = scenario(after, after, [patch_doc("p", F, copies=["toy.user:f"])])
    assert s.check().breakages == []


def test_first_pin_refuses_a_required_patch_whose_target_has_an_undeclared_copy(scenario):
    """What the loader would report as stale at start-up, pin refuses before: declare the copy."""
    tree = {"toy/mod.py": "def f(a):\n    pass\n", "toy/user.py": "from toy.mod import f\n"}
    with pytest.raises(Exception) as exc:
        scenario(tree, tree, [patch_doc("p", F, required=True)])
    assert "toy.user:f holds the target by value" in str(exc.value)
