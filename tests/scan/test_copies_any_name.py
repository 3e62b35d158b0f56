"""`scan` finds a copied upstream body whatever the plugin calls it (issue 31, item 3), built from the real case:
a scheduler subclass whose `schedule` is assigned from `schedule_v031`, a copy of vLLM 0.31.0's own
`Scheduler.schedule` (its real source, read from the installed vLLM). The draft says `reimplements` with the
score, carries `draft: true`, and once a person has reviewed it, pin on 0.31.0 and check on 0.32.0 / 0.33.0
report `source_changed` for that body, its diff whole in JSON."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.tools.releases import cached_wheel, installed_root
from vllm_patchkit.tools.scan import scan
from vllm_patchkit.tools.scan.draft import write

from .conftest import write_plugin

SCHEDULE = "vllm.v1.core.sched.scheduler:Scheduler.schedule"


def _upstream_def(module: str, qual: str) -> tuple[str, ast.AST]:
    root = installed_root()
    if root is None:
        pytest.skip("no installed vLLM tree to read")
    path = Path(root) / (module.replace(".", "/") + ".py")
    src = path.read_text(encoding="utf-8")
    node = ast.parse(src)
    for part in qual.split("."):
        node = next(n for n in node.body if getattr(n, "name", None) == part)
    return textwrap.dedent("\n".join(src.splitlines()[node.lineno - 1:node.end_lineno])), node


def _plugin(tmp_path) -> Path:
    text, _ = _upstream_def("vllm.v1.core.sched.scheduler", "Scheduler.schedule")
    copy = text.replace("def schedule(", "def schedule_v031(", 1)
    # the plugin's own edits, as a real copy has them: a renamed local and a line of its own
    copy = copy.replace("scheduled_new_reqs", "new_reqs_scheduled")
    copy = copy.replace("self.current_step += 1", "self.current_step += 1\n    self._plugin_steps = self.current_step", 1)
    return write_plugin(tmp_path / "plugin", {
        "myplug/__init__.py": "",
        "myplug/sched.py": "from vllm.v1.core.sched.output import SchedulerOutput\n"
                           "from vllm.v1.core.sched.scheduler import Scheduler\n\n\n" + copy
                           + "\n\nclass MyScheduler(Scheduler):\n    schedule = schedule_v031\n"})


def test_a_copy_under_another_name_becomes_reimplements(tmp_path, upstream):
    result = scan(str(_plugin(tmp_path)), upstream=upstream)
    assert not result.errors, result.errors
    (site,) = [s for s in result.sites if s.mechanism == "subclass_override"]
    assert site.target == SCHEDULE and site.hints["reimplements"] == [SCHEDULE]
    score = site.facts["reimplements_scores"][SCHEDULE]
    assert 0.8 <= score < 1.0  # a copy with the plugin's edits, not the same text
    folder, written, rejected = write(result, tmp_path / "drafts")
    assert not rejected
    (yml,) = [p for p in written if p.suffix == ".yaml"]
    text = yml.read_text()
    doc = yaml.safe_load(text)
    assert doc["reimplements"] == [SCHEDULE] and doc["draft"] is True and doc["required"] is True
    m = re.search(rf"# reimplements {re.escape(SCHEDULE)}: .*\(similarity (\d\.\d\d)", text)
    assert m and float(m.group(1)) >= 0.8


def test_a_helper_copied_under_another_name_is_found(tmp_path, upstream):
    """No site installs it: found among the functions of the vLLM module the file imports."""
    text, _ = _upstream_def("vllm.v1.core.kv_cache_utils", "get_kv_cache_configs")
    plugin = write_plugin(tmp_path / "p", {"hp/__init__.py": "", "hp/util.py": (
        "from vllm.v1.core import kv_cache_utils\n\n\n" + text.replace("def get_kv_cache_configs(", "def _configs(", 1))})
    result = scan(str(plugin), upstream=upstream)
    (copy,) = [s for s in result.sites if s.mechanism == "copy_body"]
    assert copy.target == "vllm.v1.core.kv_cache_utils:get_kv_cache_configs" and copy.facts["similarity"] >= 0.99


def _cli(*args, env):
    return subprocess.run([sys.executable, "-m", "vllm_patchkit.tools.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_check_reports_the_copied_body_changing(tmp_path, upstream, version):
    wheel = cached_wheel(version)
    if wheel is None:
        pytest.skip(f"no vLLM {version} wheel in the wheel cache (scripts/fetch_wheels.sh fetches it)")
    plugin = _plugin(tmp_path)
    folder, written, _ = write(scan(str(plugin), upstream=upstream), tmp_path / "drafts")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(tmp_path / "drafts")])}
    dirs = ["--patch-dir", str(folder), "--manifest-dir", str(folder / "manifests")]
    out = _cli("check", *dirs, env=env)
    assert out.returncode == 1 and "[unreviewed]" in out.stdout  # the draft as written: refused
    (yml,) = [p for p in written if p.suffix == ".yaml"]
    doc = yaml.safe_load(yml.read_text())  # what the reviewer does: the marker deleted, the TODOs written
    del doc["draft"]
    doc.update(why="the plugin schedules its own way", upstream="none: plugin policy",
               retire_when={"manual": "when vLLM schedules this way"})
    yml.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = _cli("pin", "--vllm", "0.31.0", *dirs, env=env)
    assert out.returncode == 0, out.stderr
    out = _cli("check", "--vllm", version, "--source", str(wheel), "--format", "json", *dirs, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    found = [b for b in json.loads(out.stdout)["breakages"] if b["kind"] == "source_changed"]
    assert [b["target"] for b in found] == [SCHEDULE] and found[0]["breaking"]
    assert "more diff line(s)" not in found[0]["diff"]
