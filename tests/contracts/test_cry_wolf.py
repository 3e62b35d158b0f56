"""The cry-wolf cases of issue 20: changes between vLLM 0.31.0 and 0.32.0/0.33.0 that do not break the plugin,
each built on the real vLLM classes (0.31.0 read statically with `open_release("0.31.0")`: the installed tree when
0.31.0 is installed, its cached wheel otherwise, so each test is the same whichever release is installed;
0.32.0/0.33.0 from their wheels) and the rule that now judges it. The loader tests (`subclass.check`) run against
the installed release.

Every implementation module here starts with `import os; os.abort()`: `check` and `pin` read the overrides'
signatures and `super()` calls from the source (`impl_static.py`); importing one would kill the test process.
"""

from __future__ import annotations

import textwrap

import pytest
import msgspec


from vllm_patchkit.upstream.findings import BreakageKind as K
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.upstream.compat import judge
from vllm_patchkit.tools.releases import ReleaseError, installed_root, open_release
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.declaration.validation import validate

from .helpers import cached_wheel_or_skip, patch_doc

KVM = "vllm.v1.core.kv_cache_manager:KVCacheManager"
ASYNC = "vllm.v1.core.sched.async_scheduler:AsyncScheduler"
FIELD = "scheduler_config.scheduler_cls"
ABORT = "import os\nos.abort()  # never imported: check and pin read this module from its source\n"


@pytest.fixture(scope="module")
def v031():
    """vLLM 0.31.0, the "before" of every change here, read statically: the installed tree if 0.31.0 is the
    installed release, else its wheel from the wheel cache (never the installed 0.32.0, which already has them)."""
    try:
        view = open_release("0.31.0")
    except ReleaseError as exc:
        pytest.skip(str(exc))
    assert view.version() == "0.31.0"
    return view


def wheel(version):
    return open_release(version, str(cached_wheel_or_skip(version)))


@pytest.fixture
def impl(tmp_path, monkeypatch):
    """Write an implementation module `name` (aborting on import) and make it findable on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(ABORT + textwrap.dedent(body))
        return name
    return write


def subclass_patch(target: str, implementation: str, overrides, **extra) -> Patch:
    return validate(Patch, patch_doc("sub", target, kind="subclass", implementation=implementation,
                                          config_field=FIELD, overrides=list(overrides), **extra))


def pins_on(release, patch: Patch) -> dict[str, Fingerprint]:
    found, _ = examine(release, patch, None)
    assert all(isinstance(f, Fingerprint) for f in found.values()), found
    return found


# -- 1. an optional trailing parameter, forwarded with **kwargs --------------------------------------------
FORWARDS = """
    from vllm.v1.core.kv_cache_manager import KVCacheManager


    class CountingKVCacheManager(KVCacheManager):
        def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
            return super().allocate_slots(request, num_new_tokens, *args, **kwargs)
"""
FORWARDS_KW_ONLY = """
    from vllm.v1.core.kv_cache_manager import KVCacheManager


    class CountingKVCacheManager(KVCacheManager):
        def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, **kwargs):
            return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, **kwargs)
"""
SPELLS_OUT = """
    from vllm.v1.core.kv_cache_manager import KVCacheManager


    class CountingKVCacheManager(KVCacheManager):
        def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                           num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False,
                           num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                           has_scheduled_reqs=True):
            return super().allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks,
                                          num_lookahead_tokens, num_external_computed_tokens, delay_cache_blocks,
                                          num_encoder_tokens, full_sequence_must_fit, reserved_blocks,
                                          has_scheduled_reqs)
"""


@pytest.mark.parametrize("source", [FORWARDS, FORWARDS_KW_ONLY], ids=["args-kwargs", "kwargs"])
def test_allocate_slots_gaining_skip_zeroing_group_ids_is_compatible_for_a_forwarding_override(v031, impl, source):
    """vLLM 0.32.0 adds `skip_zeroing_group_ids: tuple[int, ...] = ()` at the end of
    `KVCacheManager.allocate_slots` (0.31.0 ends at `has_scheduled_reqs`). An override forwarding **kwargs
    takes vLLM's keyword argument: compatible (before: breaking, "a subclass patch steers the target's
    behaviour")."""
    patch = subclass_patch(KVM, f"{impl('fwd', source)}:CountingKVCacheManager", ["allocate_slots"])
    pins = pins_on(v031, patch)
    assert pins[f"{KVM}.allocate_slots"].signature.endswith("has_scheduled_reqs=True)")
    _, found = examine(wheel("0.32.0"), patch, pins)
    # (an override without *args is also a convention mismatch on every release, as the loader judges it at
    # start-up: vLLM's positional call of the base's later parameters; that is not this change)
    [b] = [b for b in found if b.kind is not K.convention_mismatch]
    assert (b.kind, b.parameter, b.breaking) == (K.optional_parameter_added, "skip_zeroing_group_ids", False)
    assert b.compat.startswith("the override fwd:CountingKVCacheManager.allocate_slots(")
    assert "takes **kwargs: vLLM's keyword argument skip_zeroing_group_ids=... reaches it" in b.compat
    assert "not verified statically" in b.compat
    assert b.verdict().startswith("compatible: ")


def test_an_override_that_spells_out_the_old_parameters_breaks_on_it(v031, impl):
    patch = subclass_patch(KVM, f"{impl('spelled', SPELLS_OUT)}:CountingKVCacheManager", ["allocate_slots"])
    _, found = examine(wheel("0.32.0"), patch, pins_on(v031, patch))
    [b] = [b for b in found if b.kind is K.optional_parameter_added]
    assert b.breaking
    # the loader's convention says the same of the override on 0.32.0 (one verdict)
    assert any(c.kind is K.convention_mismatch and "skip_zeroing_group_ids" in c.detail for c in found)
    assert "does not accept 'skip_zeroing_group_ids' (no such parameter, no **kwargs)" in b.compat


def test_an_added_required_parameter_needs_kwargs_taken_as_forwarding(v031, impl):
    from vllm_patchkit.upstream.findings import Breakage

    patch = subclass_patch(KVM, f"{impl('fwd2', FORWARDS)}:CountingKVCacheManager", ["allocate_slots"])
    b = Breakage(K.required_parameter_added, patch.key, f"{KVM}.allocate_slots", parameter="budget",
                 new="keyword-only")
    j = judge(patch, b)
    assert j.breaking is False and "forwarded to super() through **kwargs" in j.compat
    strict = subclass_patch(KVM, f"{impl('spelled2', SPELLS_OUT)}:CountingKVCacheManager", ["allocate_slots"])
    assert judge(strict, b).breaking is True


# -- 2. a method now inherited, the override calling super() ---------------------------------------------
CALLS_SUPER = """
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler


    class TracingScheduler(AsyncScheduler):
        def _update_request_with_output(self, request, new_token_ids, is_stale=False):
            out = super()._update_request_with_output(request, new_token_ids, is_stale)
            return out
"""
NO_SUPER = """
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler


    class TracingScheduler(AsyncScheduler):
        def _update_request_with_output(self, request, new_token_ids, is_stale=False):
            return new_token_ids, False
"""


def test_update_request_with_output_moved_into_scheduler_is_compatible_when_the_override_calls_super(v031, impl):
    """vLLM 0.33.0 folds `AsyncScheduler._update_request_with_output` into `Scheduler`'s (same signature):
    `AsyncScheduler` now inherits it. An override of it on an AsyncScheduler subclass that calls super() still
    binds (to Scheduler's, by the MRO)."""
    patch = subclass_patch(ASYNC, f"{impl('tracing', CALLS_SUPER)}:TracingScheduler", ["_update_request_with_output"])
    spec = f"{ASYNC}._update_request_with_output"
    pins = pins_on(v031, patch)  # defined on AsyncScheduler in 0.31.0
    got = wheel("0.33.0").lookup(spec)
    assert isinstance(got, Missing) and got.inherited_from == "vllm.v1.core.sched.scheduler:Scheduler._update_request_with_output"
    # where the MRO now finds it, it is exactly as pinned: no finding at all
    _, found = examine(wheel("0.33.0"), patch, pins)
    assert found == []
    # had the definition changed on the way, the move itself is judged by the override's super() call
    from vllm_patchkit.tools.examine import examine as _  # noqa: F401  (same function as above)
    from vllm_patchkit.upstream.sigdiff import missing_breakages
    [b] = missing_breakages(patch.key, spec, got)
    j = judge(patch, b)
    assert j.kind is K.target_inherited and j.breaking is False
    assert j.compat == ("the override tracing:TracingScheduler._update_request_with_output(self, request, "
                        "new_token_ids, is_stale=False) calls super()._update_request_with_output(...), which still "
                        "binds: Python's MRO finds vllm.v1.core.sched.scheduler:Scheduler._update_request_with_output; "
                        "vLLM calls the override on the subclass as before")
    other = subclass_patch(ASYNC, f"{impl('nosuper', NO_SUPER)}:TracingScheduler", ["_update_request_with_output"])
    j = judge(other, b)
    assert j.breaking is True and "does not call super()._update_request_with_output" in j.compat
    declared = subclass_patch(ASYNC, f"{impl('nosuper2', NO_SUPER)}:TracingScheduler", ["_update_request_with_output"],
                              reimplements=[spec])
    assert judge(declared, b).breaking is False


# -- 3. a first pin of a method the base already inherits -----------------------------------------------
OVERRIDES_INHERITED = """
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler


    class TracingScheduler(AsyncScheduler):
        def schedule(self, *args, **kwargs):
            return super().schedule(*args, **kwargs)

        def _update_request_with_output(self, request, new_token_ids, is_stale=False):
            return super()._update_request_with_output(request, new_token_ids, is_stale)
"""


def test_a_first_pin_pins_an_inherited_override_where_it_is_defined(v031, impl, tmp_path):
    """`AsyncScheduler.schedule` is inherited from `Scheduler` on vLLM 0.31.0 itself: a first pin of a subclass
    overriding it is not a move (before: refused, "now inherited from ...Scheduler.schedule, no longer defined on
    AsyncScheduler"). It is pinned as Scheduler defines it; a later release is compared with that pin only."""
    from vllm_patchkit.tools.check import check
    from vllm_patchkit.declaration.declare import load_patch_set
    from vllm_patchkit.tools.pin import pin_release

    from .helpers import write_patches

    name = impl("inh", OVERRIDES_INHERITED)
    doc = patch_doc("sub", ASYNC, kind="subclass", implementation=f"{name}:TracingScheduler", config_field=FIELD,
                    overrides=["schedule", "_update_request_with_output"])
    ps = load_patch_set([write_patches(tmp_path / "patches", [doc])])
    got = v031.lookup(f"{ASYNC}.schedule")
    assert isinstance(got, Missing) and got.inherited_from == "vllm.v1.core.sched.scheduler:Scheduler.schedule"
    pinned = pin_release(v031, ps, {}, generated_by="test")
    assert not pinned.manifest.not_applicable
    [entry] = pinned.manifest.patches
    assert entry.targets[f"{ASYNC}.schedule"] == v031.lookup("vllm.v1.core.sched.scheduler:Scheduler.schedule")
    assert any("is inherited from vllm.v1.core.sched.scheduler:Scheduler.schedule on vLLM 0.31.0: pinned as "
               "defined there" in n for n in pinned.notes)
    # checked on the release it was pinned on, with its own manifest: nothing changed, nothing stale
    report = check(v031, ps, {"0.31.0": pinned.manifest})
    assert [(r.status, r.breakages) for r in report.results] == [("ok", [])]
    # on 0.33.0 schedule is still inherited, and _update_request_with_output now is too: only changes of
    # what the MRO finds, relative to the pins, are reported
    report = check(wheel("0.33.0"), ps, {"0.31.0": pinned.manifest})
    assert not [b for b in report.breakages if b.kind is K.target_inherited and b.breaking]
    assert all(b.target != f"{ASYNC}.schedule" or b.kind is not K.target_inherited for b in report.breakages)


def test_the_loader_verifies_an_inherited_override_at_its_definer(tmp_path, monkeypatch):
    """At start-up the base's inherited method is compared with its pin where the MRO finds it (live, the
    installed release, pinned from the same release read statically)."""
    from vllm_patchkit.runtime import subclass
    from vllm_patchkit.tools.releases import installed_static
    from vllm_patchkit.declaration.pins import ManifestEntry
    from vllm_patchkit.upstream.targets import resolve

    (tmp_path / "inh_live.py").write_text(textwrap.dedent(OVERRIDES_INHERITED))
    monkeypatch.syspath_prepend(str(tmp_path))
    patch = subclass_patch(ASYNC, "inh_live:TracingScheduler", ["schedule"])
    if installed_root() is None:
        pytest.skip("vLLM is not installed")
    static = installed_static()
    from vllm_patchkit.tools.pin_plan import settle_inherited

    found, _ = settle_inherited(static, patch, examine(static, patch, None)[0])
    entry = ManifestEntry(patch=patch.key, targets=found)
    impl, bad = subclass.check(patch, entry, resolve(ASYNC))
    assert bad is None and impl.__name__ == "TracingScheduler"
    changed = dict(found)
    changed[f"{ASYNC}.schedule"] = msgspec.structs.replace(found[f"{ASYNC}.schedule"], signature="(self, x)")
    impl, bad = subclass.check(patch, ManifestEntry(patch=patch.key, targets=changed), resolve(ASYNC))
    assert impl is None and bad is not None


# -- 4. a subclass __init__ judged against vLLM's constructions ---------------------------------------------
KEYWORD_INIT = """
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler


    class SizedScheduler(AsyncScheduler):
        def __init__(self, vllm_config, kv_cache_config, structured_output_manager, block_size,
                     hash_block_size=None, include_finished_set=False, log_stats=False):
            super().__init__(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                             structured_output_manager=structured_output_manager, block_size=block_size,
                             hash_block_size=hash_block_size, include_finished_set=include_finished_set,
                             log_stats=log_stats)
"""
MISSES_A_KEYWORD = KEYWORD_INIT.replace("hash_block_size=None, ", "").replace(
    "hash_block_size=hash_block_size, ", "")


def _init_patch(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return subclass_patch(ASYNC, f"{name}:SizedScheduler", ["__init__"])


def test_an_init_override_is_judged_by_the_keyword_construction_vllm_makes(v031, tmp_path, monkeypatch):
    """`AsyncScheduler.__init__` is `(self, *args, **kwargs)`; vLLM 0.31.0 builds the selected class only in
    vllm/v1/engine/core.py, `Scheduler(vllm_config=..., kv_cache_config=..., ...)`, keywords only. An override
    naming those keywords fits (before: refused, "has no *args where the target has *args")."""
    from vllm_patchkit.upstream import callsites
    from vllm_patchkit.runtime import subclass
    from vllm_patchkit.declaration.pins import ManifestEntry
    from vllm_patchkit.upstream.targets import resolve

    [call] = callsites.installed(FIELD, subclass.SELECTORS[FIELD])
    assert call.file == "vllm/v1/engine/core.py" and call.positional == 0 and not (call.star or call.dstar)
    assert set(call.keywords) == {"vllm_config", "kv_cache_config", "structured_output_manager",
                                  "include_finished_set", "log_stats", "block_size", "hash_block_size"}
    patch = _init_patch(tmp_path, monkeypatch, "sized_ok", KEYWORD_INIT)
    found, _ = examine(v031, patch, None)
    assert found[f"{ASYNC}.__init__"].signature == "(self, *args, **kwargs)"
    entry = ManifestEntry(patch=patch.key, targets=found)
    impl, bad = subclass.check(patch, entry, resolve(ASYNC))
    assert bad is None, bad.reason
    # one keyword vLLM passes is not taken: refused, naming vLLM's call site
    patch = _init_patch(tmp_path, monkeypatch, "sized_bad", MISSES_A_KEYWORD)
    impl, bad = subclass.check(patch, entry, resolve(ASYNC))
    assert impl is None and bad.code == "convention"
    assert "vLLM constructs scheduler_config.scheduler_cls's class as Cls(vllm_config=..., " in bad.reason
    assert "at vllm/v1/engine/core.py:" in bad.reason
    assert "rejects it (got an unexpected keyword argument 'hash_block_size')" in bad.reason


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_the_constructions_are_found_in_the_wheels_too(version):
    from vllm_patchkit.upstream import callsites
    from vllm_patchkit.runtime import subclass

    calls = callsites.constructions(wheel(version).release.source, FIELD, subclass.SELECTORS[FIELD], version=version)
    assert [c.file for c in calls] == ["vllm/v1/engine/core.py"] and all(c.positional == 0 for c in calls)
    import inspect

    from vllm_patchkit.upstream.impl_def import signature_of
    import ast
    sig = signature_of(ast.parse(textwrap.dedent(KEYWORD_INIT)).body[1].body[0].args)
    assert subclass.judge_constructor(subclass_patch(ASYNC, "x:SizedScheduler", ["__init__"]), sig, calls) == []
    assert isinstance(sig, inspect.Signature)


# -- a `uses` entry the class only inherits (issue 31, untrue lines) ---------------------------------------------
def test_a_used_method_the_class_inherits_is_pinned_where_the_mro_finds_it(v031):
    """`AsyncScheduler.schedule` is inherited from Scheduler on 0.31.0 and on 0.33.0. Calling it through the class
    is fine on both: before, `pin` said "now inherited from ...Scheduler.schedule, no longer defined on
    AsyncScheduler" (breaking) on the very release it was read on, and a later check repeated it."""
    use = f"{ASYNC}.schedule"
    patch = validate(Patch, patch_doc("p", "vllm.v1.core.sched.scheduler:Scheduler.update_from_output", uses=[use]))
    found, judged = examine(v031, patch, None)
    assert judged == []
    assert found[use] == v031.lookup("vllm.v1.core.sched.scheduler:Scheduler.schedule")
    _, judged = examine(wheel("0.33.0"), patch, found, v031)
    assert [b for b in judged if b.kind is K.target_inherited] == []


def test_a_target_inherited_on_the_first_release_read_is_not_said_to_have_changed(v031):
    """A wrap of a method the class only inherits is refused at pin, in words true of that release."""
    patch = validate(Patch, patch_doc("p", f"{ASYNC}.schedule"))
    _, judged = examine(v031, patch, None)
    [b] = [b for b in judged if b.kind is K.target_inherited]
    said = b.explain()
    assert said.startswith(f"{ASYNC}.schedule: inherited from vllm.v1.core.sched.scheduler:Scheduler.schedule, "
                           "not defined on AsyncScheduler: ") and "now" not in said and "no longer" not in said


def test_the_loader_verifies_a_used_inherited_method_through_the_mro():
    """The loader's reading of the same `uses` entry: the live Scheduler.schedule against its pin (no 'gone')."""
    pytest.importorskip("vllm")
    from vllm_patchkit.declaration.pins import ManifestEntry
    from vllm_patchkit.runtime.verify import verify_use
    from vllm_patchkit.tools.releases import LiveRelease

    use = f"{ASYNC}.schedule"
    patch = validate(Patch, patch_doc("p", "vllm.v1.core.sched.scheduler:Scheduler.update_from_output", uses=[use]))
    pin = LiveRelease().lookup("vllm.v1.core.sched.scheduler:Scheduler.schedule")
    assert verify_use(patch, ManifestEntry(patch=patch.key, targets={use: pin}), use) is None
