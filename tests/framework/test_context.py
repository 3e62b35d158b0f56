"""PatchContext and the calling convention `impl(wrapped, instance, args, kwargs[, ctx])`, on real vLLM targets.

What an implementation gets for each kind of target (method, classmethod, staticmethod, module
function, property getter, `instances: true`), how it reads and rewrites declared parameters
however vLLM passed them, and how its counters, notes and refusals reach its record.
"""

from __future__ import annotations

import sys

import pytest

from vllm_patchkit.runtime.context import PatchContext
from vllm_patchkit.declaration.errors import PatchkitError, Refusal
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.reporting.run_folder import load_run
from vllm_patchkit.declaration.validation import validate

from .helpers import make_loader, patch_doc, pinned_entry

pytestmark = pytest.mark.usefixtures("undo_every_loader")

EX = "vllm.v1.executor.abstract"
DISPATCH = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._determine_batch_execution_and_padding"
KV_CONFIGS = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
POOL = "vllm.v1.core.kv_cache_utils:_pool_bytes_per_block"
BLOCKS = "vllm.v1.core.block_pool:BlockPool.get_new_blocks"

RECORDING = """
    SEEN = []

    def record(wrapped, instance, args, kwargs, ctx):
        SEEN.append((wrapped, instance, args, kwargs, ctx))
        ctx.count("calls_seen")
        return wrapped(*args, **kwargs)

    def four(wrapped, instance, args, kwargs):
        SEEN.append((wrapped, instance, args, kwargs))
        return wrapped(*args, **kwargs)

    def counting(wrapped, instance, args, kwargs, ctx):
        ctx.count("hits")
        ctx.count("modes." + ("big" if ctx.arg(args, kwargs, "num_blocks") > 1 else "small"))
        ctx.note(flush=False, last=ctx.arg(args, kwargs, "num_blocks"))
        return wrapped(*args, **kwargs)

    def refusing(wrapped, instance, args, kwargs, ctx):
        ctx.refuse(f"cannot hand out {ctx.arg(args, kwargs, 'num_blocks')} blocks")
"""


def decl(target: str, params=(), **extra) -> Patch:
    return validate(Patch, patch_doc(id="p", kind="wrap", target=target, implementation="m:f",
                                          processes=["frontend"], params=list(params), **extra))


def applied(tmp_path, impl_module, target, fn="record", params=(), **extra):
    mod = impl_module(RECORDING)
    doc = patch_doc(id="p", kind="wrap", target=target, implementation=f"{mod}:{fn}", processes=["frontend"],
                    params=list(params), **extra)
    loader = make_loader(tmp_path, {"p": doc}, [pinned_entry("p@1", target)])
    loader.run_import_stage()
    assert loader.records["p"].state == "applied", loader.records["p"]
    return loader, sys.modules[mod].SEEN


@pytest.fixture
def executor():
    import vllm.v1.executor.abstract as ex

    saved = dict(ex.Executor.__dict__)
    yield ex
    for name in ("is_sleeping", "supports_async_scheduling", "get_class"):
        if ex.Executor.__dict__.get(name) is not saved[name]:
            setattr(ex.Executor, name, saved[name])


def concrete(base):
    class Concrete(base):
        def _init_executor(self):
            pass

        def check_health(self):
            pass

        def collective_rpc(self, *args, **kwargs):
            pass

    return Concrete


def block_pool():
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool(num_gpu_blocks=16, enable_caching=False, hash_block_size=16)


# -- arg / with_arg: positions from the live target, the instance excluded -------------------------
def test_arg_reads_a_declared_parameter_however_it_was_passed_on_a_real_method():
    ctx = PatchContext.detached(decl(DISPATCH, ["num_reqs", "force_uniform_decode", "max_num_scheduled_tokens"]))
    positional = (7, 3, None, 2, False)  # num_tokens, num_reqs, num_scheduled_tokens_np, max_num_..., cascade
    assert ctx.arg(positional, {}, "num_reqs") == 3
    assert ctx.arg(positional, {}, "max_num_scheduled_tokens") == 2
    assert ctx.arg((), {"num_reqs": 5}, "num_reqs") == 5
    assert ctx.arg(positional, {}, "force_uniform_decode") is None  # not passed: the upstream default
    assert ctx.arg(positional, {}, "force_uniform_decode", default="mine") == "mine"
    assert ctx.arg(positional + (True, False, True), {}, "force_uniform_decode") is True  # position 7, self excluded


def test_with_arg_replaces_in_place_or_adds_by_keyword():
    ctx = PatchContext.detached(decl(DISPATCH, ["force_uniform_decode", "num_reqs"]))
    args = (7, 3, None, 2, False, True, False, None)
    new_args, new_kwargs = ctx.with_arg(args, {}, "force_uniform_decode", False)
    assert new_args == (7, 3, None, 2, False, True, False, False) and new_kwargs == {}
    kwargs = {"num_tokens": 7, "num_reqs": 3}
    new_args, new_kwargs = ctx.with_arg((), kwargs, "force_uniform_decode", False)
    assert new_args == () and new_kwargs == {**kwargs, "force_uniform_decode": False}
    assert "force_uniform_decode" not in kwargs  # the caller's dict is left as it was
    assert ctx.with_arg((7,), {"num_reqs": 3}, "num_reqs", 4) == ((7,), {"num_reqs": 4})


def test_a_module_function_has_no_instance_to_exclude():
    ctx = PatchContext.detached(decl(KV_CONFIGS, ["vllm_config", "kv_cache_specs", "available_memory"]))
    assert ctx.arg(("cfg", "specs", "mem"), {}, "vllm_config") == "cfg"
    assert ctx.with_arg(("cfg", "specs"), {"available_memory": "m"}, "kv_cache_specs", "priced") == (
        ("cfg", "priced"), {"available_memory": "m"})
    assert ctx.with_arg(("cfg",), {"available_memory": "m"}, "available_memory", "n") == (
        ("cfg",), {"available_memory": "n"})


def test_an_undeclared_parameter_is_an_error_naming_the_patch_and_the_parameter():
    ctx = PatchContext.detached(decl(DISPATCH, ["num_reqs"]))
    with pytest.raises(PatchkitError, match=r"p@1: parameter 'num_tokens' is not declared in its `params` "
                                            r"\(\['num_reqs'\]\)"):
        ctx.arg((7, 3), {}, "num_tokens")
    with pytest.raises(PatchkitError, match="'num_tokens' is not declared"):
        ctx.with_arg((7, 3), {}, "num_tokens", 1)
    bad = PatchContext.detached(decl(DISPATCH, ["tokens"]))
    with pytest.raises(PatchkitError, match=r"declared parameter 'tokens' is not a parameter of .*\(self, num_tokens"):
        bad.arg((), {}, "tokens")


def test_holds_for_and_use_read_the_declaration():
    from types import SimpleNamespace as NS

    patch = decl(KV_CONFIGS, uses=["vllm.v1.core.kv_cache_utils:_auto_fit_max_model_len"],
                 when={"architectures": ["DeepseekV4ForCausalLM"], "served_by": "out_of_tree"})
    ctx = PatchContext.detached(patch)
    assert ctx.holds_for(NS(architectures=["LlamaForCausalLM"])) == (
        False, "architectures ['LlamaForCausalLM'] not in ['DeepseekV4ForCausalLM']")
    assert ctx.holds_for(NS(architectures=["DeepseekV4ForCausalLM"]), "plugin.model") == (
        True, "DeepseekV4ForCausalLM served by plugin.model")
    assert ctx.holds_for(NS(architectures=["DeepseekV4ForCausalLM"]), "vllm.model_executor.models.x")[0] is False
    from vllm.v1.core import kv_cache_utils

    assert ctx.use("_auto_fit_max_model_len") is kv_cache_utils._auto_fit_max_model_len
    with pytest.raises(PatchkitError, match="'nope' is not among its `uses`"):
        ctx.use("nope")
    assert not hasattr(ctx, "adapters")  # the framework knows no model adapters: a set imports its own


# -- what the implementation is handed, per kind of target ------------------------------------------
def test_method_instance_is_the_object_and_wrapped_is_bound(tmp_path, impl_module):
    from vllm.v1.core.block_pool import BlockPool

    loader, seen = applied(tmp_path, impl_module, BLOCKS, params=["num_blocks"])
    pool = block_pool()
    assert len(pool.get_new_blocks(2)) == 2
    pool.get_new_blocks(num_blocks=1)
    (w1, i1, a1, k1, ctx), (w2, i2, a2, k2, ctx2) = seen
    assert i1 is pool and w1.__self__ is pool and w1.__func__ is BlockPool.__dict__["get_new_blocks"].__wrapped__
    assert (a1, k1, a2, k2) == ((2,), {}, (), {"num_blocks": 1})
    assert ctx is ctx2 and ctx.record is loader.records["p"]
    assert ctx.arg(a1, k1, "num_blocks") == 2 and ctx.arg(a2, k2, "num_blocks") == 1
    installed = BlockPool.__dict__["get_new_blocks"]
    assert installed.__wrapped__ is w1.__func__ and installed.__vllm_patchkit__ == "p@1"  # a plain closure


def test_classmethod_instance_is_the_class(tmp_path, impl_module, executor):
    _, seen = applied(tmp_path, impl_module, f"{EX}:Executor.supports_async_scheduling")
    Sub = concrete(executor.Executor)
    assert Sub.supports_async_scheduling() is False
    assert isinstance(executor.Executor.__dict__["supports_async_scheduling"], classmethod)
    [(wrapped, instance, args, kwargs, _)] = seen
    assert instance is Sub and wrapped.__self__ is Sub and (args, kwargs) == ((), {})


def test_staticmethod_and_module_function_have_no_instance(tmp_path, impl_module, executor):
    import vllm.v1.core.kv_cache_utils as kvu

    _, seen = applied(tmp_path / "s", impl_module, f"{EX}:Executor.get_class", fn="four")
    cfg = object()
    original = executor.Executor.__dict__["get_class"].__func__.__wrapped__
    with pytest.raises(Exception):
        executor.Executor.get_class(cfg)  # vLLM's own function runs on a bare object: it fails, as unpatched
    with pytest.raises(Exception):
        object.__new__(concrete(executor.Executor)).get_class(vllm_config=cfg)  # no self inserted
    assert [(w, i, a, k) for w, i, a, k in seen] == [(original, None, (cfg,), {}), (original, None, (), {"vllm_config": cfg})]

    _, seen = applied(tmp_path / "f", impl_module, POOL, fn="four")
    import inspect

    call = ([],) if len(inspect.signature(kvu._pool_bytes_per_block).parameters) == 1 else (None, [])  # 0.31 / 0.32+
    with pytest.raises(Exception):
        kvu._pool_bytes_per_block(*call)  # forwarded to vLLM's function, which rejects an empty group list
    [(wrapped, instance, args, kwargs)] = seen
    assert wrapped is kvu._pool_bytes_per_block.__wrapped__ and instance is None and args == call


def test_property_getter_instance_is_the_object(tmp_path, impl_module, executor):
    _, seen = applied(tmp_path, impl_module, f"{EX}:Executor.is_sleeping")
    inst = object.__new__(concrete(executor.Executor))
    inst.sleeping_tags = {"weights"}
    assert inst.is_sleeping is True  # still reads as a value
    [(wrapped, instance, args, kwargs, _)] = seen
    assert instance is inst and wrapped.__self__ is inst and (args, kwargs) == ((), {})


def test_instances_true_instance_is_the_object(tmp_path, impl_module):
    loader, seen = applied(tmp_path, impl_module, BLOCKS, params=["num_blocks"], instances=True)
    pool = block_pool()
    pool.get_new_blocks(3)
    [(wrapped, instance, args, kwargs, ctx)] = seen
    assert instance is pool and wrapped.__self__ is pool and args == (3,)
    assert ctx.arg(args, kwargs, "num_blocks") == 3
    loader.sync_calls()
    assert loader.records["p"].detail["calls_seen"] == 1


# -- the record: counters at every flush, notes, refusals -------------------------------------------
def test_counters_and_notes_reach_the_written_record_at_flush(tmp_path, impl_module):
    loader, _ = applied(tmp_path, impl_module, BLOCKS, fn="counting", params=["num_blocks"])
    pool = block_pool()
    pool.get_new_blocks(2)
    pool.get_new_blocks(num_blocks=1)
    pool.get_new_blocks(3)
    loader.flush()
    [proc] = load_run(tmp_path / "status").processes
    [rec] = [r for r in proc["patches"] if r["patch"] == "p@1"]
    assert rec["calls"] == 3
    assert (rec["detail"]["hits"], rec["detail"]["modes"], rec["detail"]["last"]) == (3, {"big": 2, "small": 1}, 3)


def test_refuse_marks_the_record_refused_flushes_and_raises(tmp_path, impl_module):
    loader, _ = applied(tmp_path, impl_module, BLOCKS, fn="refusing", params=["num_blocks"])
    with pytest.raises(Refusal, match="cannot hand out 4 blocks"):
        block_pool().get_new_blocks(4)
    rec = loader.records["p"]
    assert (rec.state, rec.code, rec.reason) == ("refused", "refused", "cannot hand out 4 blocks")
    [proc] = load_run(tmp_path / "status").processes  # flushed by the refusal itself
    assert [r["state"] for r in proc["patches"] if r["patch"] == "p@1"] == ["refused"]


def test_detached_context_keeps_counters_notes_and_refusal():
    ctx = PatchContext.detached(decl(BLOCKS, ["num_blocks"]))
    ctx.count("a")
    ctx.count("a", 2)
    ctx.count("m.x")
    ctx.note(seen=1)
    assert ctx.counts == {"a": 3, "m": {"x": 1}} and ctx.notes == {"seen": 1}

    class Mine(Refusal):
        pass

    with pytest.raises(Mine, match="no"):
        ctx.refuse("no", exc=Mine)
    err = Mine("the numbers")
    with pytest.raises(Mine) as info:
        ctx.refuse("short", exc=err)
    assert info.value is err and ctx.refused == "short"
