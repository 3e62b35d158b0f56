"""`vllm-patchkit reach`: everything a whole plugin's code touches in vLLM, judged on real releases (issue 30).

The plugin is a folder written here that uses vLLM 0.31.0's real classes the ways plugins do (a guarded import, a
subclassed scheduler, a dataclass built by keyword, a function called positionally, attributes read on an
annotated parameter); each verdict is compared with what Python itself says of the live class where one exists.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from tests.contracts.test_reach import base_tree, renamed_tree  # noqa: F401  (fixtures)
from vllm_patchkit.tools.cli import main
from vllm_patchkit.tools.reach_plugin.differential import compare
from vllm_patchkit.tools.reach_plugin.plugin_modules import PluginModules
from vllm_patchkit.tools.reach_plugin.uses import BROKEN, GUARDED, OK, read
from vllm_patchkit.tools.releases import ReleaseError, installed_version, open_release
from vllm_patchkit.tools.scan.sources import open_plugin
from vllm_patchkit.tools.static import StaticRelease

vllm = pytest.importorskip("vllm")
pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="written against vLLM 0.31.0's classes")

PLUGIN = {
    "myplugin/__init__.py": "",
    "myplugin/kv.py": """\
        try:
            from vllm.v1.core.kv_cache_planning import get_kv_cache_configs
        except ImportError:
            from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
        from vllm.v1.kv_cache_interface import KVCacheConfig
        from vllm.v1.sample.sampler import Sampler


        def plan(vllm_config, specs):
            configs = get_kv_cache_configs(vllm_config, specs)
            empty = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[], block_size=16)
            fine = KVCacheConfig(1, [], [], kv_tp_replicas=2)
            return configs, empty, fine, Sampler
        """,
    "myplugin/sched.py": """\
        from vllm.v1.core.sched.interface import SchedulerInterface
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.worker.gpu_input_batch import InputBatch


        class PatientScheduler(Scheduler):
            def schedule(self, budget):
                return super().schedule(throttle_prefills=True)


        class HalfScheduler(SchedulerInterface):
            def schedule(self, throttle_prefills=False):
                return None

            def has_finished_requests(self):
                return False


        def still_prefilling(batch: InputBatch) -> bool:
            n = batch.num_reqs
            return bool((batch.num_computed_tokens_cpu[:n] < batch.num_prompt_tokens[:n]).any()) or batch.no_such_thing
        """,
}


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    for rel, text in PLUGIN.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


@pytest.fixture(scope="module")
def on_031(plugin_dir, base_tree):
    return read(PluginModules(open_plugin(str(plugin_dir))), StaticRelease.open(base_tree, "0.31.0"))


def _line(plugin_dir, rel: str, text: str) -> int:
    return next(i for i, line in enumerate((plugin_dir / rel).read_text().splitlines(), 1) if text in line)


def _uses(reach, kind, key=None):
    return [u for u in reach.uses if u.kind == kind and (key is None or u.key == key)]


def test_a_guarded_import_whose_fallback_exists_is_guarded_not_broken(on_031):
    (first,) = _uses(on_031, "import", "vllm.v1.core.kv_cache_planning:get_kv_cache_configs")
    assert first.state == GUARDED and "vllm.v1.core.kv_cache_utils:get_kv_cache_configs" in first.why
    (fallback,) = _uses(on_031, "import", "vllm.v1.core.kv_cache_utils:get_kv_cache_configs")
    assert fallback.state == OK


def test_calls_and_constructions_are_bound_like_python_binds_them(on_031, plugin_dir):
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import KVCacheConfig

    calls = {u.line: u for u in _uses(on_031, "call")}
    call = calls[_line(plugin_dir, "myplugin/kv.py", "configs = get_kv_cache_configs")]
    with pytest.raises(TypeError) as live:
        inspect.signature(get_kv_cache_configs).bind(0, 0)
    assert call.state == BROKEN and "available_memory" in call.why and "available_memory" in str(live.value)
    built = calls[_line(plugin_dir, "myplugin/kv.py", "empty = KVCacheConfig")]
    with pytest.raises(TypeError, match="block_size"):
        inspect.signature(KVCacheConfig).bind(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[], block_size=16)
    assert built.state == BROKEN and "block_size" in built.why, built
    inspect.signature(KVCacheConfig).bind(1, [], [], kv_tp_replicas=2)
    assert calls[_line(plugin_dir, "myplugin/kv.py", "fine = KVCacheConfig")].state == OK


def test_an_override_is_judged_against_the_base_signature(on_031):
    (o,) = [u for u in _uses(on_031, "override") if u.subject.endswith("PatientScheduler.schedule")]
    assert o.state == BROKEN and "throttle_prefills" in o.why and "budget" in o.why, o
    assert o.key == "vllm.v1.core.sched.scheduler:Scheduler.schedule"
    (sup,) = [u for u in _uses(on_031, "call") if u.key == "vllm.v1.core.sched.scheduler:Scheduler.schedule"]
    assert sup.state == OK  # super().schedule(throttle_prefills=True) binds


def test_abstract_methods_left_out_are_those_python_refuses(on_031):
    from vllm.v1.core.sched.interface import SchedulerInterface

    found = {u.key.rpartition(".")[2] for u in _uses(on_031, "abstract") if "HalfScheduler" in u.subject}
    live = type("HalfScheduler", (SchedulerInterface,), {"schedule": lambda self: None,
                                                         "has_finished_requests": lambda self: False})
    assert found == set(live.__abstractmethods__) and found, found


def test_attributes_on_an_annotated_parameter(on_031, plugin_dir):
    attrs = {u.key.rpartition(".")[2]: u for u in _uses(on_031, "attribute")
             if u.key.startswith("vllm.v1.worker.gpu_input_batch:InputBatch.")}
    assert attrs["num_prompt_tokens"].state == OK and attrs["num_computed_tokens_cpu"].state == OK
    assert attrs["no_such_thing"].state == BROKEN
    assert attrs["no_such_thing"].line == _line(plugin_dir, "myplugin/sched.py", "no_such_thing")


def test_differential_names_the_renamed_attribute_with_the_plugins_line(on_031, plugin_dir, renamed_tree):
    renamed = read(PluginModules(open_plugin(str(plugin_dir))), StaticRelease.open(renamed_tree, "0.31.0"))
    d = compare(on_031, renamed)
    keys = {(c.use.key, c.use.line) for c in d.breaking}
    line = _line(plugin_dir, "myplugin/sched.py", "num_prompt_tokens")
    assert keys == {("vllm.v1.worker.gpu_input_batch:InputBatch.num_prompt_tokens", line)}, d.breaking
    assert all(u.key.endswith("no_such_thing") or u.kind in ("call", "override", "abstract")
               for u in d.already_broken)


def test_cli_against_a_later_release(plugin_dir, capsys):
    try:
        open_release("0.34.0")
    except ReleaseError as exc:
        pytest.skip(f"vLLM 0.34.0 cannot be read here ({exc})")
    assert main(["reach", str(plugin_dir), "--vllm", "0.31.0", "--against", "0.34.0", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    breaking = out["against"][0]["differential"]["breaking"]
    line = _line(plugin_dir, "myplugin/kv.py", "import Sampler")
    assert any(c["use"]["key"] == "vllm.v1.sample.sampler:Sampler" and c["use"]["line"] == line for c in breaking)
    assert out["release"]["counts"]["not_followed"] >= 0 and "followed" in out["release"]


def test_the_agentinfer_cli_import_the_corpus_misses(tmp_path, capsys):
    """tests/corpus KNOWN_MISSES: agentinfer's serve entry point imports make_arg_parser from modules 0.33.0
    removed. Its real source, downloaded here (never kept in the repository)."""
    for v in ("0.31.0", "0.33.0"):
        try:
            open_release(v)
        except ReleaseError as exc:
            pytest.skip(f"vLLM {v} cannot be read here ({exc})")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp_path),
                          "agentinfer-zmj-test==0.1.1"], capture_output=True, text=True, timeout=120)
    wheels = list(tmp_path.glob("agentinfer_zmj_test-0.1.1-*.whl"))
    if got.returncode != 0 or not wheels:
        pytest.skip(f"agentinfer-zmj-test 0.1.1 cannot be downloaded here (offline?): {got.stderr.strip()[-200:]}")
    assert main(["reach", str(wheels[0]), "--vllm", "0.31.0", "--against", "0.33.0", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert [u for u in out["release"]["uses"] if u["state"] == BROKEN] == []
    breaking = out["against"][0]["differential"]["breaking"]
    hits = {c["use"]["key"] for c in breaking if c["use"]["file"].endswith("cli/serve_profile.py")}
    assert hits == {"vllm.entrypoints.launchers.cli_args:make_arg_parser",
                    "vllm.entrypoints.openai.cli_args:make_arg_parser"}, breaking
