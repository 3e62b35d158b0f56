"""Kind `subclass`: a subclass of vLLM's real Scheduler, selected through SchedulerConfig.scheduler_cls (issue 12:
ATOM overrides Scheduler methods by subclassing and writing scheduler_cls). Verified against the base's pins,
applied on a real VllmConfig at the config stage, built by vLLM's own code path, recorded and undone."""

from __future__ import annotations

import pickle

import pytest

from vllm_patchkit.declaration.errors import PatchSetErrors
from vllm_patchkit.declaration.validation import validate

from .helpers import live_pin, make_loader, patch_doc, pinned_entry

pytestmark = pytest.mark.usefixtures("undo_every_loader")

BASE = "vllm.v1.core.sched.scheduler:Scheduler"
FIELD = "scheduler_config.scheduler_cls"

SUBCLASS = """
from vllm.v1.core.sched.scheduler import Scheduler


class MyScheduler(Scheduler):
    schedules = 0

    def schedule(self, throttle_prefills=False):
        type(self).schedules += 1
        return super().schedule(throttle_prefills)
"""


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    """A real VllmConfig from vLLM's EngineArgs and a tiny local Llama (as tests/config_stage builds them)."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("ckpt") / "llama", architecture="LlamaForCausalLM")
    return EngineArgs(model=str(model), max_model_len=512, dtype="float32").create_engine_config()


@pytest.fixture
def vc(vllm_config):
    """The shared config, its scheduler fields put back after each test whatever it asserted."""
    sc = vllm_config.scheduler_config
    saved = sc.scheduler_cls, sc.async_scheduling
    yield vllm_config
    sc.scheduler_cls, sc.async_scheduling = saved


def doc(impl: str, overrides=("schedule",), **extra) -> dict:
    return patch_doc(id="sub", kind="subclass", target=BASE, implementation=impl, config_field=FIELD,
                     overrides=list(overrides), processes=["engine_core"], **extra)


def entry(overrides=("schedule",), key="sub@1") -> dict:
    return pinned_entry(key, BASE, *[f"{BASE}.{m}" for m in overrides])


def loader_for(tmp_path, vc, impl, *, overrides=("schedule",), docs=None, entries=None, run=True):
    loader = make_loader(tmp_path, {"sub": doc(impl, overrides), **(docs or {})},
                         [entry(overrides)] + list(entries or []), role="engine_core")
    loader.run_import_stage()
    if run:
        loader.run_config_stage(vc)
    return loader


def build_scheduler(cls, vc):
    """What EngineCore does with the class (vllm/v1/engine/core.py), on a small KV cache made by vLLM's own code."""
    import torch
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.structured_output import StructuredOutputManager

    bs = vc.cache_config.block_size
    vc.cache_config.kv_cache_layout = "BLHNC"  # EngineCore resolves it before sizing; the CPU accepts it
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
    configs = kv_cache_utils.get_kv_cache_configs(vc, [{"model.layers.0.self_attn": spec}], [64 * spec.page_size_bytes])
    sched_cfg = kv_cache_utils.generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = sched_cfg.num_blocks  # as EngineCore records it after sizing
    return cls(vllm_config=vc, kv_cache_config=sched_cfg,
               structured_output_manager=StructuredOutputManager(vc), block_size=bs, log_stats=False)


@pytest.fixture
def my_scheduler(impl_module):
    import importlib

    name = impl_module(SUBCLASS)
    return f"{name}:MyScheduler", importlib.import_module(name).MyScheduler


def test_config_stage_selects_the_subclass_vllm_builds_it_and_unpatch_restores(tmp_path, vc, my_scheduler):
    from vllm.v1.core.sched.scheduler import Scheduler

    spec, cls = my_scheduler
    assert vc.scheduler_config.scheduler_cls is None  # vLLM's default: it picks Scheduler itself
    loader = loader_for(tmp_path, vc, spec)
    rec = loader.records["sub"]
    assert rec.state == "applied" and rec.stage == "config", rec
    assert vc.scheduler_config.scheduler_cls is cls
    assert rec.detail["config_field"] == FIELD and rec.detail["previous"] == "None"
    chosen = vc.scheduler_config.get_scheduler_cls()  # the call EngineCore makes before building it
    assert chosen is cls
    # pickled as the config travels to other processes: the class goes by reference
    assert pickle.loads(pickle.dumps(vc.scheduler_config)).get_scheduler_cls() is cls
    sched = build_scheduler(chosen, vc)
    sched.schedule()
    assert cls.schedules == 1  # the override ran (and called up into vLLM's)
    loader.sync_calls()
    assert rec.calls == 1 and rec.detail["built"] == 1  # one scheduler built
    assert loader.process.config["classes"]["scheduler"] == spec  # the shadow check sees the subclass in use
    loader.unpatch()
    assert vc.scheduler_config.scheduler_cls is None
    assert vc.scheduler_config.get_scheduler_cls() is Scheduler
    assert "__init__" not in cls.__dict__  # the counting __init__ is gone
    build_scheduler(cls, vc)
    loader.sync_calls()
    assert rec.calls == 1


def test_engine_core_builds_the_subclass_from_its_config_ready_point(tmp_path, vc, my_scheduler):
    """Where vLLM reads the field: EngineCore calls get_scheduler_cls() after building its executor, whose
    __init__ is EngineCore's config-ready point; the config is final there (the front end's point runs before
    VllmConfig.__post_init__, where the platform still has the last word). Checked on vLLM's source."""
    import inspect

    from vllm.v1.engine.core import EngineCore

    src = inspect.getsource(EngineCore.__init__)
    assert src.index("load_general_plugins()") < src.index("executor_class(vllm_config)") \
        < src.index("get_scheduler_cls()") < src.index("self.scheduler: SchedulerInterface = Scheduler(")


ENGINE_CORE = """
import json, sys
from pathlib import Path

import yaml

from tests.framework.helpers import make_loader, patch_doc, pinned_entry
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.tools.serve.tiny_model import build_tiny_model

tmp = Path(sys.argv[1])
hook = yaml.safe_load(Path("src/vllm_patchkit/hooks/config_ready_engine_core.yaml").read_text())
sub = patch_doc(id="sub", kind="subclass", target=sys.argv[2], implementation=sys.argv[3], config_field=sys.argv[4],
                overrides=["schedule"], processes=["engine_core"])
loader = make_loader(tmp, {"hook": hook, "sub": sub},
                     [pinned_entry("core.config-ready.engine-core@1", hook["target"], *hook["uses"]),
                      pinned_entry("sub@1", sys.argv[2], sys.argv[2] + ".schedule")], role="engine_core")
runtime.install(loader)
loader.run_import_stage()  # installs EngineCore's config-ready point (Executor.__init__)

from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.uniproc_executor import UniProcExecutor

model = build_tiny_model(tmp / "ckpt", architecture="LlamaForCausalLM")
vc = EngineArgs(model=str(model), max_model_len=512, dtype="float32").create_engine_config()
before = vc.scheduler_config.scheduler_cls
core = EngineCore(vc, UniProcExecutor, log_stats=False)
loader.sync_calls()
rec = loader.records["sub"]
kind = type(core.scheduler)
print("RESULT " + json.dumps({"before": repr(before), "scheduler": f"{kind.__module__}:{kind.__qualname__}",
                              "state": str(rec.state), "built": rec.detail.get("built")}))
core.shutdown()
"""


@pytest.mark.e2e
def test_a_real_engine_core_builds_the_subclass(tmp_path, impl_module):
    """vLLM's own EngineCore (in a fresh process, with the UniProc executor on the CPU) builds the scheduler from
    the field set at its config-ready point: the whole path, no stand-in (~35 s)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import PRISTINE_ENV

    name = impl_module(SUBCLASS)
    root = Path(__file__).resolve().parents[2]
    env = {**PRISTINE_ENV, "VLLM_PLUGINS": "", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(root), str(tmp_path)])}
    out = subprocess.run([sys.executable, "-c", ENGINE_CORE, str(tmp_path / "run"), BASE, f"{name}:MyScheduler", FIELD],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stderr[-3000:]
    assert json.loads(line[7:]) == {"before": "None", "scheduler": f"{name}:MyScheduler", "state": "applied",
                                    "built": 1}


def test_a_second_loader_is_a_no_op_and_the_first_unpatch_restores(tmp_path, vc, my_scheduler):
    spec, cls = my_scheduler
    first = loader_for(tmp_path / "a", vc, spec)
    second = loader_for(tmp_path / "b", vc, spec)
    assert second.records["sub"].state == "applied"
    assert "already" in second.records["sub"].detail
    assert vc.scheduler_config.scheduler_cls is cls
    second.unpatch()
    assert vc.scheduler_config.scheduler_cls is cls  # the first one's change stands
    first.unpatch()
    assert vc.scheduler_config.scheduler_cls is None


def test_a_field_naming_the_base_counts_as_the_default_and_is_restored_exactly(tmp_path, vc, my_scheduler):
    spec, cls = my_scheduler
    vc.scheduler_config.scheduler_cls = "vllm.v1.core.sched.scheduler.Scheduler"
    loader = loader_for(tmp_path, vc, spec)
    assert loader.records["sub"].state == "applied"
    assert vc.scheduler_config.scheduler_cls == f"{cls.__module__}.MyScheduler"  # a string stays a string
    assert vc.scheduler_config.get_scheduler_cls() is cls
    loader.unpatch()
    assert vc.scheduler_config.scheduler_cls == "vllm.v1.core.sched.scheduler.Scheduler"


@pytest.mark.parametrize("other", ["class", "string"])
def test_a_field_holding_another_choice_is_a_conflict_never_overwritten(tmp_path, vc, my_scheduler, other):
    from vllm.v1.core.sched.scheduler import Scheduler

    spec, _ = my_scheduler

    class TheirScheduler(Scheduler):
        pass

    theirs = TheirScheduler if other == "class" else "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
    vc.scheduler_config.scheduler_cls = theirs
    rec = loader_for(tmp_path, vc, spec).records["sub"]
    assert rec.state == "failed" and rec.code == "conflict", rec
    assert FIELD in rec.reason and "refusing to overwrite" in rec.reason
    assert vc.scheduler_config.scheduler_cls is theirs


def test_a_base_vllm_would_not_build_here_is_skipped(tmp_path, vc, my_scheduler):
    spec, _ = my_scheduler
    vc.scheduler_config.async_scheduling = True  # vLLM picks AsyncScheduler for the default field
    rec = loader_for(tmp_path, vc, spec).records["sub"]
    assert rec.state == "skipped" and rec.code == "not_selected", rec
    assert "AsyncScheduler" in rec.reason
    assert vc.scheduler_config.scheduler_cls is None


def test_a_listed_override_the_subclass_does_not_define_fails(tmp_path, vc, my_scheduler):
    spec, _ = my_scheduler
    rec = loader_for(tmp_path, vc, spec, overrides=("schedule", "finish_requests")).records["sub"]
    assert rec.state == "failed" and rec.code == "override", rec
    assert "does not override 'finish_requests'" in rec.reason and "inherits it from " + BASE in rec.reason
    assert vc.scheduler_config.scheduler_cls is None


def test_a_changed_base_method_is_a_fingerprint_finding(tmp_path, vc, my_scheduler):
    spec, _ = my_scheduler
    stale = entry()
    stale["targets"][f"{BASE}.schedule"]["signature"] = "(self)"  # as pinned on a release without the parameter
    loader = make_loader(tmp_path, {"sub": doc(spec)}, [stale], role="engine_core")
    loader.run_config_stage(vc)
    rec = loader.records["sub"]
    assert rec.state == "failed" and rec.code == "fingerprint", rec
    # the override takes the added parameter by name: compatible for this patch (compat's override rule), but
    # pins are compared exactly at start-up, so the record still fails until the release is re-pinned
    assert "throttle_prefills" in rec.reason and "compatible" in rec.reason and "re-pin" in rec.reason
    assert rec.findings and rec.findings[0]["code"] == "breakage"
    assert vc.scheduler_config.scheduler_cls is None


def test_an_override_that_does_not_take_the_base_signature_fails(tmp_path, vc, impl_module):
    name = impl_module(SUBCLASS.replace("def schedule(self, throttle_prefills=False)", "def schedule(self, throttle)")
                       .replace("super().schedule(throttle_prefills)", "super().schedule(throttle)"))
    rec = loader_for(tmp_path, vc, f"{name}:MyScheduler").records["sub"]
    assert rec.state == "failed" and rec.code == "convention", rec
    assert "renamed parameter 'throttle_prefills' to 'throttle'" in rec.reason


def test_an_undeclared_override_of_a_method_another_patch_pins_fails(tmp_path, vc, impl_module):
    target = f"{BASE}.finish_requests"
    name = impl_module(SUBCLASS + "\n    def finish_requests(self, request_ids, finished_status):\n"
                                  "        return super().finish_requests(request_ids, finished_status)\n")
    other = patch_doc(id="probe", kind="wrap", target=target, processes=["engine_core"])
    rec = loader_for(tmp_path, vc, f"{name}:MyScheduler", docs={"probe": other},
                     entries=[pinned_entry("probe@1", target)]).records["sub"]
    assert rec.state == "failed" and rec.code == "undeclared_override", rec
    assert "probe@1" in rec.reason and "finish_requests" in rec.reason


def test_an_implementation_that_is_no_subclass_fails(tmp_path, vc, impl_module):
    name = impl_module("class MyScheduler:\n    def schedule(self, throttle_prefills=False):\n        pass\n")
    rec = loader_for(tmp_path, vc, f"{name}:MyScheduler").records["sub"]
    assert rec.state == "failed" and rec.code == "implementation", rec
    assert "is not a subclass of " + BASE in rec.reason


def test_selected_but_never_built_is_a_finding(tmp_path, vc, my_scheduler):
    spec, _ = my_scheduler
    loader = loader_for(tmp_path, vc, spec)
    loader.standing.report_not_built(steps=8)  # as sync_calls does once the engine counted steps
    rec = loader.records["sub"]
    assert rec.detail["built"] == 0
    assert [f["code"] for f in rec.findings] == ["not_built"]


def test_the_overridden_base_methods_are_pinned(my_scheduler):
    from vllm_patchkit.declaration.schema import Patch

    patch = validate(Patch, doc(my_scheduler[0], overrides=("schedule", "_update_requests_with_invalid_blocks")))
    assert patch.pinned_specs == [BASE, f"{BASE}.schedule", f"{BASE}._update_requests_with_invalid_blocks"]
    assert patch.stage == "config"
    assert live_pin(f"{BASE}.schedule")["signature"] == "(self, throttle_prefills=False)"


@pytest.mark.parametrize("extra, words", [
    ({"config_field": None}, "needs 'config_field'"),
    ({"overrides": []}, "needs 'overrides' \\(a non-empty list"),
    ({"target": f"{BASE}.schedule"}, "to name a class"),
    ({"implementation": None}, "needs 'implementation'"),
    ({"overrides": ["schedule", "schedule"]}, "names a method twice"),
    ({"kind": "wrap", "implementation": None}, "only for kind subclass"),
    ({"config_field": "scheduler_config..scheduler_cls"}, "config_field"),
])
def test_declaration_errors(tmp_path, extra, words):
    from vllm_patchkit.declaration.declare import load_patch_set

    from .helpers import write_patch

    d = {k: v for k, v in {**doc("m:C"), **extra}.items() if v is not None}
    write_patch(tmp_path / "p", "sub", d)
    with pytest.raises(PatchSetErrors, match=words):
        load_patch_set([tmp_path / "p"])
