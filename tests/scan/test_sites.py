"""Each site kind on a small fixture plugin written in tmp_path (our own code), scanned against the installed
vLLM read statically (never imported)."""

from __future__ import annotations

import ast
import sys

from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.upstream import normalised_lines, similarity

from .conftest import write_plugin

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
SCHED = "vllm.v1.core.sched.scheduler:Scheduler"


def _sites(tmp_path, upstream, files, **kw):
    write_plugin(tmp_path / "src", files)
    result = scan(str(tmp_path / "src"), upstream=upstream, **kw)
    assert not [e for e in result.errors if "scan error" in e[1]], result.errors
    return result


def _one(result, mechanism, target=None):
    hits = [s for s in result.sites if s.mechanism == mechanism and (target is None or s.target == target)]
    assert hits, f"no {mechanism} site at {target}: {[(s.mechanism, s.target, s.where) for s in result.sites]}"
    return hits[0]


def test_wrap_replace_setattr_and_aliases(tmp_path, upstream):
    r = _sites(tmp_path, upstream, {"myplug/__init__.py": '''
        import functools
        import vllm.v1.worker.gpu_model_runner as gmr
        from vllm.v1.core.sched.scheduler import Scheduler
        import vllm

        def _wrapper(fn):
            @functools.wraps(fn)
            def inner(*a, **k):
                return fn(*a, **k)
            return inner

        def register():
            gmr.GPUModelRunner.execute_model = _wrapper(gmr.GPUModelRunner.execute_model)   # wrap
            orig = Scheduler.schedule
            def schedule(self):
                return orig(self)
            Scheduler.schedule = schedule                                                  # wrap (closure)
            def update_from_output(self, *a):
                return None
            Scheduler.update_from_output = update_from_output                              # replace
            vllm.v1.worker.gpu_model_runner.GPUModelRunner._sync_device = lambda self: None  # chain, replace
            setattr(Scheduler, "max_num_running_reqs", 4)                                  # set literal
            for name in ("finish_requests",):
                setattr(Scheduler, name, _wrapper(getattr(Scheduler, name)))               # loop over names
    '''})
    w = _one(r, "wrap", f"{RUNNER}.execute_model")
    assert w.declare == "wrap" and w.line == 14 and w.file == "myplug/__init__.py"
    assert _one(r, "wrap", f"{SCHED}.schedule").declare == "wrap"
    rep = _one(r, "replace", f"{SCHED}.update_from_output")
    assert rep.declare == "replace" and rep.facts["impl_spec"] is None  # a closure: not importable
    assert _one(r, "replace", f"{RUNNER}._sync_device").declare == "replace"
    s = _one(r, "setattr", f"{SCHED}.max_num_running_reqs")
    assert s.declare == "set" and s.hints["value"] == 4
    assert _one(r, "wrap", f"{SCHED}.finish_requests").declare == "wrap"


def test_class_swap_and_functools_wraps_and_wrapt(tmp_path, upstream):
    r = _sites(tmp_path, upstream, {
        "myplug/runner.py": '''
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner
            class MyRunner(GPUModelRunner):
                pass
        ''',
        "myplug/patch.py": '''
            import functools
            import wrapt
            from vllm.v1.worker import gpu_model_runner
            from .runner import MyRunner

            def install():
                gpu_model_runner.GPUModelRunner = MyRunner
                orig = gpu_model_runner.GPUModelRunner.load_model
                @functools.wraps(orig)
                def load_model(self, *a, **k):
                    return orig(self, *a, **k)
                wrapt.wrap_function_wrapper("vllm.v1.core.sched.scheduler", "Scheduler.schedule", _w)

            def _w(wrapped, instance, args, kwargs):
                return wrapped(*args, **kwargs)

            @wrapt.patch_function_wrapper("vllm.v1.core.sched.scheduler", "Scheduler.add_request")
            def _w2(wrapped, instance, args, kwargs):
                return wrapped(*args, **kwargs)
        '''})
    swap = _one(r, "class_swap", RUNNER)
    assert swap.declare == "set" and swap.hints["value_from"] == "myplug.runner:MyRunner"
    assert _one(r, "functools_wraps", f"{RUNNER}.load_model").declare == "wrap"
    assert _one(r, "wrapt", f"{SCHED}.schedule").declare == "wrap"
    assert _one(r, "wrapt", f"{SCHED}.add_request").declare == "wrap"


def test_instances_sys_modules_env_registry(tmp_path, upstream):
    r = _sites(tmp_path, upstream, {"myplug/boot.py": '''
        import os, sys, types
        from vllm import ModelRegistry
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        os.environ.setdefault("HOME_NOT_VLLM", "x")
        sys.modules["vllm.v1.worker.fake_mod"] = types.ModuleType("fake")
        ModelRegistry.register_model("MyArch", "myplug.model:MyModel")

        def _execute(self, *a, **k):
            return None

        def attach(runner: GPUModelRunner):
            runner.execute_model = types.MethodType(_execute, runner)

        def observe(holder):
            mgr = holder.kv_cache_manager
            native = getattr(mgr, "get_computed_blocks")
            def observed(request):
                return native(request)
            mgr.get_computed_blocks = observed
    '''})
    envs = [s for s in r.sites if s.mechanism == "env"]
    assert [s.facts["env"] for s in envs] == ["VLLM_USE_V2_MODEL_RUNNER", "VLLM_ENABLE_V1_MULTIPROCESSING"]
    assert envs[0].declare == "env_default" and envs[0].hints["env_default"] == {
        "name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}
    assert any("overwrites" in n for n in envs[1].notes)
    sm = _one(r, "sys_modules")
    assert sm.declare is None and "sys.modules" in sm.reason
    reg = _one(r, "registry")
    assert reg.declare is None and "registr" in reg.reason
    inst = _one(r, "instance_attr", f"{RUNNER}.execute_model")
    assert inst.declare == "wrap" and inst.hints == {"instances": True}
    unknown = [s for s in r.sites if s.mechanism == "instance_attr" and s.target is None]
    assert unknown and unknown[0].declare is None and "computed at run time" in unknown[0].reason


def test_config_fields_and_subclass_overrides(tmp_path, upstream):
    r = _sites(tmp_path, upstream, {"myplug/sched.py": '''
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

        class MySched(Scheduler):
            def schedule(self):
                out = super().schedule()
                return out

            def update_from_output(self, scheduler_output, model_runner_output):
                return {}

            def brand_new_method(self):
                return 1

        class MyPolicy(CachePolicy):
            def get(self, key):
                return None

        def configure(config):
            config.scheduler_config.scheduler_cls = MySched
            config.parallel_config.worker_cls = "myplug.worker.MyWorker"
    '''})
    overrides = {s.target: s for s in r.sites if s.mechanism == "subclass_override"}
    assert set(overrides) >= {f"{SCHED}.schedule", f"{SCHED}.update_from_output"}
    assert not any(t.endswith("brand_new_method") for t in overrides)  # not on the base: not an override
    assert overrides[f"{SCHED}.schedule"].facts["calls_super"] is True
    assert overrides[f"{SCHED}.update_from_output"].facts["calls_super"] is False
    assert "does not call super()" in overrides[f"{SCHED}.update_from_output"].notes
    sub = overrides[f"{SCHED}.schedule"]
    assert sub.declare == "subclass" and sub.hints["config_field"] == "scheduler_config.scheduler_cls"
    pol = next(s for s in r.sites if s.mechanism == "subclass_override" and "CachePolicy" in s.target)
    assert pol.declare is None and "config field" in pol.reason
    fields = {s.facts["field"]: s for s in r.sites if s.mechanism == "config_field"}
    assert fields["scheduler_cls"].declare == "subclass"
    assert fields["scheduler_cls"].hints["implementation"] == "myplug.sched:MySched"
    assert fields["worker_cls"].declare is None  # a string path to a class the scan cannot read as a subclass


def test_copied_body_detected(tmp_path, upstream):
    """A plugin function that copies an upstream body (written here from the installed tree at test time,
    never stored in the repository) is a copy_body site and a `reimplements` hint of the site installing it."""
    spec = "vllm.v1.core.kv_cache_utils:get_kv_cache_configs"
    d = upstream.definition(spec)
    assert d is not None
    body = ast.unparse(d.node)
    r = _sites(tmp_path, upstream, {"myplug/kv.py": (
        "from vllm.v1.core import kv_cache_utils\n"
        "from vllm.v1.core.kv_cache_utils import *\n\n"
        + body + "\n\n"
        "def install():\n"
        "    kv_cache_utils.get_kv_cache_configs = get_kv_cache_configs\n")})
    copy = _one(r, "copy_body", spec)
    assert copy.facts["similarity"] >= 0.99
    rep = _one(r, "replace", spec)
    assert rep.hints["reimplements"] == [spec]
    assert rep.facts["impl_spec"] == "myplug.kv:get_kv_cache_configs"


def test_similarity_ignores_docstrings_and_comments():
    a = ast.parse('def f(x):\n    """doc"""\n    y = x + 1  # c\n    z = y * 2\n    w = z - 1\n    return w\n').body[0]
    b = ast.parse("def f(x):\n    y = x + 1\n    z = y * 2\n    w = z - 1\n    return w\n").body[0]
    assert normalised_lines(a) == normalised_lines(b)
    assert similarity(a, b) == 1.0


def test_broken_inputs_are_findings_not_crashes(tmp_path, upstream):
    write_plugin(tmp_path / "p", {"ok.py": "import vllm\nvllm.X = 1\n", "bad.py": "def f(:\n", "nul.py": "x = 1\x00\n"})
    (tmp_path / "p" / "latin.py").write_bytes(b"# -*- coding: ascii -*-\nx = '\xff'\n")
    r = scan(str(tmp_path / "p"), upstream=upstream)
    bad = {f for f, _ in r.errors}
    assert {"bad.py", "latin.py"} <= bad
    assert any(s.mechanism == "parse_error" and s.file == "bad.py" for s in r.sites)
    for odd in [tmp_path / "missing", tmp_path / "p" / "bad.py"]:
        scan(str(odd), upstream=upstream)
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"PK\x03\x04 not a zip")
    r = scan(str(junk), upstream=upstream)
    assert r.files == 0 and r.errors
    r = scan("no-such-distribution-xyz", upstream=upstream)
    assert r.errors and "no installed distribution" in r.errors[0][1]
    deep = "x = " + "(" * 3000 + ")" * 3000 + "\n"
    write_plugin(tmp_path / "deep", {"d.py": deep})
    assert scan(str(tmp_path / "deep"), upstream=upstream).errors


def test_wheel_sdist_and_installed_distribution(tmp_path, upstream):
    import tarfile
    import zipfile

    files = {"myplug/__init__.py": "from vllm.v1.core.sched.scheduler import Scheduler\nScheduler.foo_attr = 1\n",
             "tests/test_x.py": "from vllm.v1.core.sched.scheduler import Scheduler\nScheduler.schedule = None\n"}
    src = write_plugin(tmp_path / "tree", files)
    whl = tmp_path / "myplug-0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.write(src / "myplug/__init__.py", "myplug/__init__.py")
    sdist = tmp_path / "myplug-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for rel in files:
            tf.add(src / rel, f"myplug-0.1/{rel}")
    for path in (whl, sdist, src):
        r = scan(str(path), upstream=upstream)
        assert [(s.mechanism, s.file, s.line) for s in r.sites] == [("setattr", "myplug/__init__.py", 2)], path
    assert len(scan(str(sdist), upstream=upstream, include_tests=True).sites) == 2
    # an installed distribution, by name: this project's own (its files found through importlib.metadata)
    r = scan("vllm-patchkit", upstream=upstream)
    assert r.files > 10 and not [e for e in r.errors if "scan error" in e[1]]
    assert "vllm" not in sys.modules or True  # the scan never imports vLLM (checked in test_no_import)


def test_scan_never_imports_vllm(tmp_path):
    import subprocess

    code = ("import sys; from vllm_patchkit.tools.scan import scan; "
            f"r = scan({str(tmp_path)!r}); assert 'vllm' not in sys.modules, 'imported vllm'; print('ok')")
    write_plugin(tmp_path, {"p/__init__.py": "import vllm.v1.core.sched.scheduler as s\ns.Scheduler.x = 1\n"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
