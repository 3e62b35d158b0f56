"""The implementation must take the calls vLLM makes, in its kind's shape (convention.py, verify).

A `wrap` is `impl(wrapped, instance, args, kwargs[, ctx])`: vLLM's call arrives as a tuple and
a dict, so what is judged is the shape and the declared `params` (each must be a parameter of
the pinned target). A `replace` is called like the target: the two replacements that broke in
production are reproduced against the real vLLM 0.31 targets (a `_pool_bytes_per_block` of the
wrong arity, and a V2-runner `postprocess_sampled` that renamed `sampled_tokens` and made
`query_start_loc` required; vLLM's pipeline-parallel call `postprocess_sampled(**outputs)` leaves
it out). Each is caught by the loader before anything is installed, with a message naming the
parameter. The rest of the rules run on synthetic signatures.
"""

from __future__ import annotations

import inspect

import pytest
import yaml

from vllm_patchkit.upstream import convention
from vllm_patchkit.upstream import fingerprint as fp
from vllm_patchkit.upstream.convention import problems, problems_for
from vllm_patchkit.upstream.findings import Finding
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.upstream.targets import resolve
from vllm_patchkit.declaration.validation import validate

from .helpers import make_loader, patch_doc, pinned_entry
from tests.releases import only_on

ONLY_031 = only_on("0.31.0", "the ATOM V4.1 wrapper-arity bug replayed against _pool_bytes_per_block(kv_cache_groups), its one-parameter form (0.32 added vllm_config)")

POOL = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"
POST = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.postprocess_sampled"
POOL_ON_0_32 = "(vllm_config, kv_cache_groups)"  # vLLM 0.32 added vllm_config in front (manifests/vllm-0.32.0.yaml)

pytestmark = pytest.mark.usefixtures("undo_every_loader")




def real_signature(spec: str) -> str:
    place = resolve(spec)
    return fp.live(place.get_raw(), place.owner_is_class).signature




def codes(found):
    return [(p.code, p.where) for p in found]


# -- the two historical bugs, on the real targets ---------------------------------------------------
@ONLY_031
def test_real_signatures_are_the_pinned_ones():
    from patchkit_deepseek_v4 import MANIFESTS

    pins = yaml.safe_load((MANIFESTS / "vllm-0.31.0.yaml").read_text())
    by_spec = {s: t for e in pins["patches"] for s, t in e["targets"].items()}
    assert real_signature(POST) == by_spec[POST]["signature"] == (
        "(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None)")
    assert real_signature(POOL) == by_spec[POOL]["signature"] == "(kv_cache_groups)"


def test_postprocess_sampled_replacement_renaming_sampled_tokens_and_requiring_query_start_loc_is_caught():
    def postprocess_sampled(self, idx_mapping, tokens, num_sampled, num_rejected, query_start_loc):
        return None

    found = problems(postprocess_sampled, real_signature(POST), shape="replace",
                     name="plugin.runner:postprocess_sampled", target_kind="method")
    assert codes(found) == [("renamed", "sampled_tokens"), ("made_required", "query_start_loc")]
    assert [p.reason for p in found] == [
        "implementation plugin.runner:postprocess_sampled renamed parameter 'sampled_tokens' to 'tokens' "
        "(position 2): vLLM's keyword call sampled_tokens=... raises TypeError",
        "implementation plugin.runner:postprocess_sampled makes parameter 'query_start_loc' required (the target's "
        "default is None): vLLM's call without it raises TypeError",
    ]
    # what the messages claim is what vLLM's pipeline-parallel call does to it (update_pp_decode_requests)
    outputs = dict(idx_mapping=1, sampled_tokens=2, num_sampled=3, num_rejected=4)
    inspect.signature(real_signature_target()).bind(object(), **outputs)  # upstream takes it
    with pytest.raises(TypeError):
        inspect.signature(postprocess_sampled).bind(object(), **outputs)


def real_signature_target():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return GPUModelRunner.postprocess_sampled


@ONLY_031
def test_pool_bytes_replacement_of_the_wrong_arity_is_caught():
    # written for vLLM 0.32's (vllm_config, kv_cache_groups), installed on 0.31's (kv_cache_groups)
    def pool_bytes(vllm_config, kv_cache_groups):
        return 0

    found = problems(pool_bytes, real_signature(POOL), shape="replace", name="plugin.kv:pool_bytes")
    assert codes(found) == [("reordered", "kv_cache_groups"), ("extra_required", "vllm_config")]
    assert found[0].reason == (
        "implementation plugin.kv:pool_bytes takes 'vllm_config' at position 0 where the target takes "
        "'kv_cache_groups': vLLM's positional call binds the value of 'kv_cache_groups' to 'vllm_config'")
    assert found[1].reason == (
        "implementation plugin.kv:pool_bytes requires parameter 'vllm_config', which the target does not have: "
        "vLLM never passes it, so every call raises TypeError")


@ONLY_031
def test_pool_bytes_replacement_taking_one_argument_where_vllm_passes_two_is_caught():
    # the bug as it happened: the replacement took one argument, vLLM's function took two
    def pool_bytes(kv_cache_groups):
        return 0

    assert problems(pool_bytes, real_signature(POOL), shape="replace") == []  # right for 0.31
    found = problems(pool_bytes, POOL_ON_0_32, shape="replace", name="plugin.kv:pool_bytes")
    assert codes(found) == [("dropped", "vllm_config"), ("reordered", "vllm_config")]
    assert found[0].reason == (
        "implementation plugin.kv:pool_bytes does not accept parameter 'vllm_config' (the target takes it at "
        "position 0): vLLM's call passing it raises TypeError")


def test_loader_refuses_the_postprocess_sampled_replacement_before_installing(tmp_path, impl_module):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    mod = impl_module("""
        def postprocess_sampled(self, idx_mapping, tokens, num_sampled, num_rejected, query_start_loc):
            return None
    """)
    before = GPUModelRunner.__dict__["postprocess_sampled"]
    impl = f"{mod}:postprocess_sampled"
    doc = patch_doc(id="pp", kind="replace", target=POST, implementation=impl, processes=["frontend"])
    loader = make_loader(tmp_path, {"pp": doc}, [pinned_entry("pp@1", POST)])
    loader.run_import_stage()
    rec = loader.records["pp"]
    assert (rec.state, rec.code) == ("failed", "convention")
    assert rec.expected == "(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None)"
    assert rec.found == "(self, idx_mapping, tokens, num_sampled, num_rejected, query_start_loc)"
    assert rec.reason == (
        f"implementation {impl} renamed parameter 'sampled_tokens' to 'tokens' (position 2): vLLM's keyword call "
        f"sampled_tokens=... raises TypeError; implementation {impl} makes parameter 'query_start_loc' required "
        "(the target's default is None): vLLM's call without it raises TypeError")
    assert GPUModelRunner.__dict__["postprocess_sampled"] is before  # nothing installed


@ONLY_031
def test_loader_refuses_the_pool_bytes_replacement_and_a_required_one_stops_startup(tmp_path, impl_module):
    import vllm.v1.core.kv_cache_utils as kvu

    from vllm_patchkit.declaration.errors import RequiredPatchFailed

    mod = impl_module("""
        def pool_bytes(vllm_config, kv_cache_groups):
            return 0
    """)
    before = kvu._pool_bytes_per_block
    doc = patch_doc(id="pool", kind="replace", target=POOL, implementation=f"{mod}:pool_bytes",
                    processes=["frontend"], required=True)
    loader = make_loader(tmp_path, {"pool": doc}, [pinned_entry("pool@1", POOL)])
    with pytest.raises(RequiredPatchFailed) as ei:
        loader.run_import_stage()
    rec = ei.value.record
    assert rec.code == "convention" and "'vllm_config'" in rec.reason and "'kv_cache_groups'" in rec.reason
    assert (rec.expected, rec.found) == ("(kv_cache_groups)", "(vllm_config, kv_cache_groups)")
    assert kvu._pool_bytes_per_block is before


def test_wraps_of_both_shapes_apply(tmp_path, impl_module):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    mod = impl_module("""
        def forward(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)

        def with_ctx(wrapped, instance, args, kwargs, ctx):
            return wrapped(*args, **kwargs)
    """)
    for name in ("forward", "with_ctx"):
        doc = patch_doc(id="pp", kind="wrap", target=POST, implementation=f"{mod}:{name}", processes=["frontend"],
                        params=["sampled_tokens", "query_start_loc"])
        loader = make_loader(tmp_path / name, {"pp": doc}, [pinned_entry("pp@1", POST)])
        loader.run_import_stage()
        try:
            assert loader.records["pp"].state == "applied", loader.records["pp"]
            assert GPUModelRunner.__dict__["postprocess_sampled"].__wrapped__ is not None
        finally:
            loader.unpatch()


def test_shipped_implementations_fit_their_targets():
    """Every implementation the shipped patch set carries accepts every call to its pinned target."""
    from vllm_patchkit.runtime.loader import Loader

    loader = Loader.builtin(role="frontend", write_records=False)
    checked = 0
    for patch, entry, _ in loader.plan:
        if entry is not None and patch.implementation and patch.target in entry.targets:
            pin = entry.targets[patch.target]
            assert problems_for(patch, pin.signature, target_kind=pin.kind) == [], patch.key
            checked += 1
    assert checked >= 4


# -- every rule of a replacement, on synthetic signatures ------------------------------------------
def f_dropped(a): ...
def f_renamed_kw(a, bee, **kw): ...
def f_reordered(b, a): ...
def f_made_required(a, b): ...
def f_kwonly_missing(a, b=None): ...
def f_no_varkw(a, b=None, *, c=None): ...
def f_no_varargs(a, b=None, *, c=None, **kw): ...
def f_extra(a, b=None, *args, c=None, d, **kw): ...
def f_star_only(*args): ...
def f_star_and_names(*args, a=None, b=None, c=None, **kw): ...
def f_posonly(a, b=None, /, *args, c=None, **kw): ...
def f_extra_positional(a, b=None, extra=0, *args, c=None, **kw): ...


TARGET = "(a, b=None, *rest, c=None, **kw)"


@pytest.mark.parametrize("impl, expected", [
    (f_dropped, [("dropped", "b"), ("no_varargs", "rest"), ("kwonly_not_accepted", "c"), ("no_varkw", "kw")]),
    (f_renamed_kw, [("renamed", "b"), ("made_required", "b"), ("no_varargs", "rest")]),
    (f_reordered, [("reordered", "a"), ("reordered", "b"), ("made_required", "b"), ("no_varargs", "rest"),
                   ("kwonly_not_accepted", "c"), ("no_varkw", "kw")]),
    (f_made_required, [("made_required", "b"), ("no_varargs", "rest"), ("kwonly_not_accepted", "c"),
                       ("no_varkw", "kw")]),
    (f_kwonly_missing, [("no_varargs", "rest"), ("kwonly_not_accepted", "c"), ("no_varkw", "kw")]),
    (f_no_varkw, [("no_varargs", "rest"), ("no_varkw", "kw")]),
    (f_no_varargs, [("no_varargs", "rest")]),
    (f_extra, [("extra_required", "d")]),
    (f_star_only, [("not_by_keyword", "a"), ("not_by_keyword", "b"), ("kwonly_not_accepted", "c"),
                   ("no_varkw", "kw")]),
    (f_star_and_names, [("keyword_only", "a"), ("keyword_only", "b")]),
    (f_posonly, [("not_by_keyword", "a"), ("not_by_keyword", "b")]),
    (f_extra_positional, [("extra_positional", "extra")]),
])
def test_each_rule(impl, expected):
    assert codes(problems(impl, TARGET, shape="replace")) == expected


def test_messages_name_the_parameter_and_the_call_that_breaks():
    by: dict[str, str] = {}
    for f in (f_renamed_kw, f_dropped, f_star_only, f_star_and_names, f_extra_positional, f_extra):
        for p in problems(f, TARGET, shape="replace", name="x:f"):
            by.setdefault(p.code, p.reason)
    assert by["renamed"] == ("implementation x:f renamed parameter 'b' to 'bee' (position 1): vLLM's keyword call "
                             "b=... lands in **kw and leaves 'bee' unset (TypeError)")
    assert by["dropped"] == ("implementation x:f does not accept parameter 'b' (the target takes it at position 1, "
                             "default None): vLLM's call passing it raises TypeError")
    assert by["kwonly_not_accepted"] == ("implementation x:f does not accept keyword-only parameter 'c' (the target "
                                         "takes it by keyword, default None): vLLM's keyword call raises TypeError")
    assert by["no_varargs"] == ("implementation x:f has no *args where the target has *rest: vLLM's call with more "
                                "than 2 positional arguments raises TypeError")
    assert by["no_varkw"] == ("implementation x:f has no **kwargs where the target has **kw: vLLM's call with any "
                              "other keyword argument raises TypeError")
    assert by["not_by_keyword"] == ("implementation x:f does not accept parameter 'a' by keyword (the target takes "
                                    "it): vLLM's keyword call raises TypeError")
    assert by["keyword_only"] == ("implementation x:f takes parameter 'a' keyword-only where the target takes it at "
                                  "position 0: vLLM's positional call puts it in *args and leaves 'a' at its default "
                                  "None")
    assert by["extra_positional"] == ("implementation x:f takes 'extra' at position 2, where the target collects "
                                      "extra positional arguments in *rest: vLLM's extra positional argument binds "
                                      "to 'extra'")
    assert by["extra_required"] == ("implementation x:f requires parameter 'd', which the target does not have: "
                                    "vLLM never passes it, so a call that does not pass it raises TypeError")


def test_query_start_loc_only_through_star_args_is_not_accepted_by_keyword():
    def postprocess_sampled(*args):
        return None

    found = problems(postprocess_sampled, real_signature(POST), shape="replace", name="vllm_patchkit.x:f",
                     target_kind="method")
    assert [p.where for p in found] == ["idx_mapping", "sampled_tokens", "num_sampled", "num_rejected",
                                            "query_start_loc"]  # never 'self': Python binds it
    assert found[-1].reason == (
        "implementation vllm_patchkit.x:f does not accept parameter 'query_start_loc' by keyword (the target takes "
        "it, default None): vLLM's keyword call raises TypeError")


def test_positional_only_target_parameters_may_take_any_name():
    def f(x, y=None, /): ...

    assert problems(f, "(a, b=None, /)", shape="replace") == []
    assert codes(problems(f, "(a, b, /)", shape="replace")) == []
    assert codes(problems(lambda x, y, /: 0, "(a, b=None, /)", shape="replace")) == [("made_required", "b")]


def test_replace_is_compared_with_all_its_parameters():
    def replacement(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None): ...
    def wrong(self, idx_mapping, sampled_tokens, num_sampled, num_rejected): ...

    sig = real_signature(POST)
    assert problems(replacement, sig, shape="replace") == []
    assert codes(problems(wrong, sig, shape="replace")) == [("dropped", "query_start_loc")]
    # a replacement declared as a wrap is caught by the wrap's shape
    assert codes(problems(replacement, sig, shape="wrap")) == [("shape", None)]


def test_signature_objects_and_unreadable_signatures():
    sig = inspect.signature(lambda kv_cache_groups: 0)
    assert problems(sig, "(kv_cache_groups)", shape="replace") == []
    assert problems(len, "(kv_cache_groups)") in ([], problems(len, "(kv_cache_groups)"))  # builtins: judged or not
    assert problems(lambda x: 0, "not a signature", shape="replace") == []
    assert problems(lambda wrapped, instance, args, kwargs: 0, "not a signature", params=["x"]) == []


def test_problems_for_serves_the_check_command(impl_module):
    mod = impl_module("""
        def pool_bytes(wrapped, instance, args, kwargs, ctx):
            return wrapped(*args, **kwargs)

        NOT_CALLABLE = 3
    """)
    base = dict(patch_doc(id="pool", kind="wrap", target=POOL, processes=["engine_core"]))
    patch = validate(Patch, {**base, "implementation": f"{mod}:pool_bytes", "params": ["vllm_config"]})
    found = problems_for(patch, "(kv_cache_groups)")
    assert [(p.code, p.where) for p in found] == [("unknown_param", "vllm_config")]
    assert all(isinstance(p, Finding) and str(p) == p.reason for p in found)
    assert problems_for(patch, None) == []
    assert problems_for(validate(Patch, base), "(kv_cache_groups)") == []  # a passthrough: nothing to judge
    gone = problems_for(validate(Patch, {**base, "implementation": f"{mod}:nope"}), "(kv_cache_groups)")
    assert [p.code for p in gone] == ["implementation"] and "nope" in gone[0].reason
    odd = problems_for(validate(Patch, {**base, "implementation": f"{mod}:NOT_CALLABLE"}), "(kv_cache_groups)")
    assert [p.code for p in odd] == ["implementation"] and "not callable" in odd[0].reason


# -- a wrap: the shape, and the declared params --------------------------------------------------
def w_four(wrapped, instance, args, kwargs): ...
def w_five(wrapped, instance, args, kwargs, ctx): ...
def w_five_default(wrapped, instance, args, kwargs, ctx=None): ...
def w_old(original, *args, **kwargs): ...
def w_old_named(original, self, a, b=None): ...
def w_three(wrapped, instance, args): ...
def w_six(wrapped, instance, args, kwargs, ctx, extra): ...
def w_kwonly(wrapped, instance, args, kwargs, *, must): ...


@pytest.mark.parametrize("impl, shape", [
    (w_four, False), (w_five, True), (w_five_default, True), (w_old, None), (w_old_named, False),
    (w_three, None), (w_six, None), (w_kwonly, None),
])
def test_wrap_shape_is_four_or_five_positional_parameters(impl, shape):
    assert convention.wrap_takes_context(impl) is shape
    assert codes(problems(impl, TARGET)) == ([] if shape is not None else [("shape", None)])


def test_the_old_original_first_form_is_a_shape_problem():
    [p] = problems(w_old, TARGET, name="x:f")
    assert p.reason == ("implementation x:f cannot be called as impl(wrapped, instance, args, kwargs) or "
                         "impl(wrapped, instance, args, kwargs, ctx): a wrap takes exactly 4 positional parameters, "
                         "or 5 to get the context; its signature is (original, *args, **kwargs)")


def test_declared_params_must_be_parameters_of_the_target():
    sig = real_signature(POST)
    assert problems(w_five, sig, params=["sampled_tokens", "query_start_loc"], target_kind="method") == []
    found = problems(w_five, sig, params=["tokens", "self"], target_kind="method", patch="pp@1")
    assert codes(found) == [("unknown_param", "tokens"), ("unknown_param", "self")]
    assert found[0].reason == (
        "patch pp@1 declares parameter 'tokens' in `params`, but the target's signature (self, idx_mapping, "
        "sampled_tokens, num_sampled, num_rejected, query_start_loc=None) has no such parameter")
    assert found[1].reason.endswith("(the instance is `instance`, not a parameter)")
    assert problems(w_five, TARGET, params=["a", "c"]) == []  # positional and keyword-only alike
    assert codes(problems(w_five, TARGET, params=["rest", "kw"])) == [("unknown_param", "rest"),
                                                                    ("unknown_param", "kw")]


def test_loader_refuses_a_declared_param_missing_from_the_target(tmp_path, impl_module):
    """Regression: a `params` entry the pinned signature does not have is a `convention` finding."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    mod = impl_module("""
        def post(wrapped, instance, args, kwargs, ctx):
            return wrapped(*args, **kwargs)
    """)
    before = GPUModelRunner.__dict__["postprocess_sampled"]
    doc = patch_doc(id="pp", kind="wrap", target=POST, implementation=f"{mod}:post", processes=["frontend"],
                    params=["sampled_tokens", "tokens"])
    loader = make_loader(tmp_path, {"pp": doc}, [pinned_entry("pp@1", POST)])
    loader.run_import_stage()
    rec = loader.records["pp"]
    assert (rec.state, rec.code) == ("failed", "convention")
    assert rec.reason == ("patch pp@1 declares parameter 'tokens' in `params`, but the target's signature "
                          f"{rec.expected} has no such parameter")
    assert rec.expected == "(self, idx_mapping, sampled_tokens, num_sampled, num_rejected, query_start_loc=None)"
    assert rec.found == "(wrapped, instance, args, kwargs, ctx)"
    assert GPUModelRunner.__dict__["postprocess_sampled"] is before  # nothing installed


def test_params_only_for_a_wrap_with_an_implementation():
    from pydantic import ValidationError

    base = patch_doc(id="p", target=POOL, processes=["engine_core"])
    validate(Patch, {**base, "kind": "wrap", "implementation": "m:f", "params": ["kv_cache_groups"]})
    for extra in ({"kind": "wrap"}, {"kind": "replace", "implementation": "m:f"}):
        with pytest.raises(ValidationError, match="'params' is only for kind wrap with an implementation"):
            validate(Patch, {**base, **extra, "params": ["kv_cache_groups"]})
    with pytest.raises(ValidationError, match="names a parameter twice"):
        validate(Patch, {**base, "kind": "wrap", "implementation": "m:f", "params": ["a", "a"]})
