"""Counters of a plugin's own components (not patches) in the process record: `vllm_patchkit.runtime.state.count`.

Why: a plugin's copier or a stand-in executor counts what only it knows (restores right / wrong); the operator
must see those figures where the patches' are: the record file, `vllm-patchkit status` (table and JSON) and
/metrics. The stateful stand-in serve uses it for real (tests/e2e/test_stateful_standin_e2e.py).
"""

from __future__ import annotations

import json

from prometheus_client.core import CounterMetricFamily

from vllm_patchkit.reporting import metrics, run_folder, status
from vllm_patchkit.runtime import state as runtime
from vllm_patchkit.runtime.flush import Flusher

from .helpers import make_loader


def test_counts_reach_the_record_the_table_and_metrics(tmp_path):
    loader = make_loader(tmp_path, {}, [], role="engine_core")
    runtime.install(loader)
    try:
        flusher = Flusher(loader, interval=0)
        assert flusher.tick()  # the first flush
        assert not flusher.tick()  # nothing changed
        runtime.count("my_plugin.copier", "restores_right", 3)
        runtime.count("my_plugin.copier", "restores_wrong", 0)
        assert flusher.tick()  # a component's count alone is a change worth writing
        (path,) = (tmp_path / "status").glob("*/*.json")
        assert json.loads(path.read_text())["counters"] == {"my_plugin.copier": {"restores_right": 3,
                                                                                 "restores_wrong": 0}}
        run = run_folder.load_run(tmp_path / "status")
        assert "engine_core %d: my_plugin.copier: restores_right 3, restores_wrong 0" % loader.process.pid \
            in status.render(run)
        assert json.loads(status.to_json(run))["processes"][0]["counters"]["my_plugin.copier"]["restores_right"] == 3
        (fam,) = [f for f in metrics.families(run) if f.name == "vllm_patchkit_component_counts"]
        assert isinstance(fam, CounterMetricFamily)
        got = {(s.labels["source"], s.labels["name"], s.labels["role"]): s.value for s in fam.samples
               if s.name.endswith("_total")}
        assert got == {("my_plugin.copier", "restores_right", "engine_core"): 3,
                       ("my_plugin.copier", "restores_wrong", "engine_core"): 0}
    finally:
        runtime.reset()


def test_a_loader_that_is_not_the_process_one_does_not_take_them(tmp_path):
    """Tests and tools make loaders of their own: only the process's loader (runtime.current) records them."""
    mine = make_loader(tmp_path / "a", {}, [])
    other = make_loader(tmp_path / "b", {}, [])
    runtime.install(mine)
    try:
        runtime.count("x", "n")
        mine.sync_calls()
        other.sync_calls()
        assert mine.process.counters == {"x": {"n": 1}} and other.process.counters == {}
    finally:
        runtime.reset()
