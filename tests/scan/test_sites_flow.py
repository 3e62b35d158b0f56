"""Patches installed through the plugin's own code paths (helper functions, loops over tables and computed lists,
objects typed by what vLLM annotates), each on a small fixture plugin of our own written in tmp_path, scanned
against the installed vLLM read statically. The patterns are the ones ROCm/ATOM's plugin uses
(tests/data/atom_scan_recall.yaml); the fixtures are ours."""

from __future__ import annotations

from vllm_patchkit.tools.scan import scan

from .conftest import write_plugin

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
SCHED = "vllm.v1.core.sched.scheduler:Scheduler"
KVM = "vllm.v1.core.kv_cache_manager:KVCacheManager"


def _scan(tmp_path, upstream, files):
    write_plugin(tmp_path / "src", files)
    result = scan(str(tmp_path / "src"), upstream=upstream)
    assert not [e for e in result.errors if "scan error" in e[1]], result.errors
    return result


def _targets(result, mechanism=None):
    return {s.target for s in result.sites if mechanism is None or s.mechanism == mechanism}


def test_helper_called_per_owner_and_name(tmp_path, upstream):
    """A helper `_wrap(cls, name)` is read once per call: each (class, name) pair is a site, no cross pairs."""
    r = _scan(tmp_path, upstream, {"myplug/patch.py": '''
        import functools
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
        from vllm.v1.core.sched.scheduler import Scheduler

        def _wrap(cls, method_name):
            original = getattr(cls, method_name, None)
            @functools.wraps(original)
            def wrapped(self, *args, **kwargs):
                return original(self, *args, **kwargs)
            setattr(cls, method_name, wrapped)

        def _scope(cls):
            original = cls.prepare_inputs
            def wrapped(self, *args, **kwargs):
                return original(self, *args, **kwargs)
            setattr(cls, "prepare_inputs", wrapped)

        def install():
            _wrap(GPUModelRunner, "execute_model")
            _wrap(Scheduler, "schedule")
            _wrap(RunnerV2, "capture_model")
            _scope(RunnerV2)
    '''})
    wraps = _targets(r, "wrap")
    assert {f"{RUNNER}.execute_model", f"{SCHED}.schedule", f"{RUNNER_V2}.capture_model",
            f"{RUNNER_V2}.prepare_inputs"} <= wraps
    assert f"{SCHED}.execute_model" not in _targets(r) and f"{RUNNER}.schedule" not in _targets(r)
    assert f"{RUNNER}.capture_model" not in _targets(r)  # the V1 runner is only called with execute_model
    assert not [s for s in r.sites if (s.dotted or "").endswith("<dynamic>")]
    w = next(s for s in r.sites if s.mechanism == "wrap" and s.target == f"{SCHED}.schedule")
    assert w.declare == "wrap" and w.facts["calls_original"] is True


def test_table_of_owner_name_wrapper_rows(tmp_path, upstream):
    """`for owner, name, wrapper in TABLE: setattr(owner, name, wrapper(getattr(owner, name)))`."""
    r = _scan(tmp_path, upstream, {"myplug/table.py": '''
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.core.sched.scheduler import Scheduler

        def _timed(fn):
            def inner(*a, **k):
                return fn(*a, **k)
            return inner

        def _logged(fn):
            def inner(*a, **k):
                return fn(*a, **k)
            return inner

        _PATCHES = (
            (GPUModelRunner, "execute_model", _timed),
            (Scheduler, "schedule", _logged),
        )

        def install():
            for owner, name, wrapper in _PATCHES:
                setattr(owner, name, wrapper(getattr(owner, name)))
            for name, value in {"max_num_running_reqs": 8}.items():
                setattr(Scheduler, name, value)
    '''})
    wraps = {s.target: s for s in r.sites if s.mechanism == "wrap"}
    assert {f"{RUNNER}.execute_model", f"{SCHED}.schedule"} <= set(wraps)
    assert f"{RUNNER}.schedule" not in _targets(r)
    assert wraps[f"{SCHED}.schedule"].facts["impl_spec"] == "myplug.table:_logged"
    assert any(s.mechanism == "setattr" and s.target == f"{SCHED}.max_num_running_reqs" for s in r.sites)


def test_modules_list_and_name_constant(tmp_path, upstream):
    """A list of modules built in a loop over a constant tuple of names, filtered, then each rebound with
    `setattr(module, ATTR, patched)` (ATTR a module constant): the defining module and the by-value copy."""
    r = _scan(tmp_path, upstream, {"myplug/kvcfg.py": '''
        import importlib

        _TARGETS = ("vllm.v1.core.kv_cache_utils", "vllm.v1.engine.core")
        _ATTR = "get_kv_cache_configs"

        def install():
            modules = []
            for name in _TARGETS:
                try:
                    modules.append(importlib.import_module(name))
                except ImportError:
                    pass
            modules = [m for m in modules if hasattr(m, _ATTR)]
            current = getattr(modules[0], _ATTR)

            def patched(*args, **kwargs):
                return _hook(current, *args, **kwargs)

            for module in modules:
                setattr(module, _ATTR, patched)

        def _hook(original, *args, **kwargs):
            return original(*args, **kwargs)
    '''})
    sites = [s for s in r.sites if s.mechanism == "wrap"]
    assert {s.target for s in sites} == {"vllm.v1.core.kv_cache_utils:get_kv_cache_configs",
                                         "vllm.v1.engine.core:get_kv_cache_configs"}
    copy = next(s for s in sites if s.target.startswith("vllm.v1.engine.core"))
    assert copy.defined_at == "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
    assert all(s.facts["calls_original"] for s in sites)  # `current` is one of the two originals


def test_loop_over_classes_a_plugin_function_returns(tmp_path, upstream):
    """`for cls in runner_classes():` where runner_classes (another module of the plugin) imports both runner
    modules by name and returns their classes; and a class bound to a variable (`cls = GPUModelRunner`)."""
    r = _scan(tmp_path, upstream, {
        "myplug/targets.py": '''
            _MODULES = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")

            def runner_classes():
                classes = []
                for module_name in _MODULES:
                    try:
                        module = __import__(module_name, fromlist=["GPUModelRunner"])
                        cls = module.GPUModelRunner
                    except ImportError:
                        continue
                    if cls not in classes:
                        classes.append(cls)
                return classes
        ''',
        "myplug/dummy.py": '''
            import functools
            from myplug.targets import runner_classes

            def install():
                for runner_cls in runner_classes():
                    original = getattr(runner_cls, "_dummy_run", None)

                    def make(original):
                        @functools.wraps(original)
                        def wrapped(self, *args, **kwargs):
                            return original(self, *args, **kwargs)
                        return wrapped

                    runner_cls._dummy_run = make(original)

            def pin():
                from vllm.v1.core.sched.scheduler import Scheduler
                cls = Scheduler
                cls.max_num_running_reqs = 4
        '''})
    assert {f"{RUNNER}._dummy_run", f"{RUNNER_V2}._dummy_run"} <= _targets(r, "wrap")
    assert f"{SCHED}.max_num_running_reqs" in _targets(r, "setattr")
    assert not [s for s in r.sites if s.mechanism == "instance_attr" and s.target is None]


def test_partialmethod_and_import_fallback(tmp_path, upstream):
    """functools.partialmethod installs (wrap when bound to the original, else replace); a name imported in a
    try/except from a module the release lacks and one it has resolves to the one it has, in either order."""
    r = _scan(tmp_path, upstream, {"myplug/misc.py": '''
        import functools
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        def _schedule(self, *args, original=None, **kwargs):
            return original(self, *args, **kwargs)

        def _execute(self, *args, **kwargs):
            return None

        def _default_dtype(attention):
            orig = attention.process_weights_after_loading
            def wrapped(self, act_dtype=None):
                return orig(self, act_dtype)
            attention.process_weights_after_loading = wrapped

        def install():
            Scheduler.schedule = functools.partialmethod(_schedule, original=Scheduler.schedule)
            GPUModelRunner.execute_model = functools.partialmethod(_execute)
            try:
                from vllm.attention.layer import Attention, MLAAttention
            except ImportError:
                from vllm.model_executor.layers.attention import Attention, MLAAttention
            _default_dtype(Attention)
            _default_dtype(MLAAttention)
    '''})
    by = {(s.mechanism, s.target) for s in r.sites}
    assert ("wrap", f"{SCHED}.schedule") in by
    assert ("replace", f"{RUNNER}.execute_model") in by
    pwal = {s.defined_at or s.target for s in r.sites if s.mechanism == "wrap"
            and (s.target or "").endswith("process_weights_after_loading")}
    assert pwal == {"vllm.model_executor.layers.attention.attention:Attention.process_weights_after_loading",
                    "vllm.model_executor.layers.attention.mla_attention:MLAAttention.process_weights_after_loading"}


def test_installed_method_self_and_attribute_types(tmp_path, upstream):
    """A function installed as `Scheduler.__init__` gets a Scheduler as `self`; what it hands a helper is typed
    by the release (`scheduler.kv_cache_manager` is a KVCacheManager), so the helper's instance wraps have a
    target; what the method sets on its own object is not a site; a plugin object's attribute is what its
    `__init__` stored."""
    r = _scan(tmp_path, upstream, {"myplug/sched.py": '''
        import functools
        from vllm.v1.core.sched.scheduler import Scheduler

        class Holder:
            def __init__(self, scheduler):
                self.manager = scheduler.kv_cache_manager

        def _bind(scheduler):
            kvm = getattr(scheduler, "kv_cache_manager", None)
            for name in ("free", "pop_blocks_for_free"):
                orig = getattr(kvm, name)
                def wrapped(request, *a, _orig=orig, **k):
                    return _orig(request, *a, **k)
                setattr(kvm, name, wrapped)
            holder = Holder(scheduler)
            coordinator = holder.manager.coordinator
            orig_rsb = coordinator.remove_skipped_blocks
            def remove_skipped_blocks(*a, **k):
                return orig_rsb(*a, **k)
            coordinator.remove_skipped_blocks = remove_skipped_blocks

        def install():
            orig_init = Scheduler.__init__
            @functools.wraps(orig_init)
            def __init__(self, *args, **kwargs):
                orig_init(self, *args, **kwargs)
                _bind(self)
                self._mine = 1
            Scheduler.__init__ = __init__
    '''})
    inst = {s.target: s for s in r.sites if s.facts.get("instance")}
    assert {f"{KVM}.free", f"{KVM}.pop_blocks_for_free",
            "vllm.v1.core.kv_cache_coordinator:KVCacheCoordinator.remove_skipped_blocks"} <= set(inst)
    assert inst[f"{KVM}.free"].declare == "wrap" and inst[f"{KVM}.free"].hints == {"instances": True}
    assert f"{SCHED}._mine" not in _targets(r)


def test_mixin_override_registry_tables_and_config_refusals(tmp_path, upstream):
    """A mixin's method overrides the vLLM base of the class that mixes it in; a registration names the table it
    stores into; a platform's config hook (and the function it calls) refusing a configuration and writing a
    field of the run's config are sites, the refusal on the hook as the Platform interface defines it."""
    r = _scan(tmp_path, upstream, {
        "myplug/sched.py": '''
            from vllm.v1.core.sched.scheduler import Scheduler

            class _CapMixin:
                def _get_local_prefix_cache_hit(self, request):
                    return super()._get_local_prefix_cache_hit(request)

            class CappedScheduler(_CapMixin, Scheduler):
                """Selected through scheduler_cls."""
        ''',
        "myplug/register.py": '''
            from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
            from vllm.model_executor.layers.quantization import register_quantization_config
            from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

            def register():
                KVConnectorFactory.register_connector("Mine", "myplug.conn", "MineConnector")

                @register_quantization_config("mine")
                class MineConfig(QuantizationConfig):
                    pass
        ''',
        "myplug/platform.py": '''
            from vllm.platforms.interface import Platform

            def _enforce(vllm_config):
                if vllm_config.speculative_config is not None:
                    msg = "myplug does not support speculative decoding"
                    raise ValueError(msg)
                try:
                    vllm_config.compilation_config.cudagraph_mode = None
                except AttributeError:
                    raise RuntimeError("re-raised: not a refusal")

            class MyPlatform(Platform):
                @classmethod
                def check_and_update_config(cls, vllm_config) -> None:
                    super().check_and_update_config(vllm_config)
                    _enforce(vllm_config)
        '''})
    mixin = [s for s in r.sites if s.mechanism == "subclass_override" and s.facts.get("mixin")]
    assert [s.target for s in mixin] == [f"{SCHED}._get_local_prefix_cache_hit"]
    assert mixin[0].file == "myplug/sched.py" and mixin[0].line == 5
    writes = {w for s in r.sites if s.mechanism == "registry" for w in s.writes}
    assert "vllm.distributed.kv_transfer.kv_connector.factory:KVConnectorFactory._registry" in writes
    assert "vllm.model_executor.layers.quantization:_CUSTOMIZED_METHOD_TO_QUANT_CONFIG" in writes
    refusals = [s for s in r.sites if s.mechanism == "refuse"]
    assert [(s.target, s.line) for s in refusals] == [("vllm.platforms.interface:Platform.check_and_update_config", 7)]
    assert refusals[0].declare is None and "refuse" in refusals[0].reason
    assert refusals[0].hints["message"] == "'myplug does not support speculative decoding'"
    field = next(s for s in r.sites if s.target == "vllm.config.compilation:CompilationConfig.cudagraph_mode")
    assert field.mechanism == "setattr" and field.declare is None and "run's" in field.reason
