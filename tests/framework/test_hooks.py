"""`kind: hook`: a plugin class vLLM reaches without the framework — a KV connector the plugin registers with
`KVConnectorFactory.register_connector` (ROCm/ATOM's AtomLMCacheOffloadConnector), a layer or model class found
through a registry — whose methods vLLM calls on the plugin's objects (issue 31, item 4: "hook methods vLLM calls
on plugin objects, pinned as the call vLLM makes"). Each overridden base method is pinned as `target.method`; the
override is judged against it as a subclass's is, by `check` and by the loader in the same words; nothing is
installed. On the real `KVConnectorBase_V1` of the installed vLLM 0.31.0 and its wheels.
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.validation import validate
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import ReleaseError, installed_static, installed_version, open_release
from vllm_patchkit.upstream.findings import BreakageKind

from .helpers import live_pin, make_loader, patch_doc

pytestmark = [pytest.mark.usefixtures("undo_every_loader"),
              pytest.mark.skipif(installed_version() != "0.31.0", reason="read against vLLM 0.31.0")]
BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1"


from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402


class PluginConnector(KVConnectorBase_V1):  # our stand-in: the plugin's hook signatures, no body
    def get_finished(self, finished_req_ids):
        return None, None

    def wait_for_save(self):
        return None


class NarrowConnector(KVConnectorBase_V1):  # takes fewer parameters than vLLM passes
    def get_finished(self):
        return None, None


class NotAConnector:
    def get_finished(self, finished_req_ids):
        return None, None


def _doc(impl: str = "PluginConnector", overrides=("get_finished", "wait_for_save")) -> dict:
    return patch_doc(id="conn", kind="hook", target=BASE, implementation=f"{__name__}:{impl}",
                     overrides=list(overrides), processes=["worker"])


def _pins(overrides=("get_finished", "wait_for_save")) -> dict:
    return {BASE: live_pin(BASE), **{f"{BASE}.{m}": live_pin(f"{BASE}.{m}") for m in overrides}}


def test_the_overridden_base_methods_are_pinned_and_fit():
    found, said = examine(installed_static(), validate(Patch, _doc()), None)
    assert said == []
    assert sorted(found) == [BASE, f"{BASE}.get_finished", f"{BASE}.wait_for_save"]
    assert found[f"{BASE}.get_finished"].signature == "(self, finished_req_ids)"


def test_the_later_releases_keep_the_calls_the_hooks_take():
    pins, _ = examine(installed_static(), validate(Patch, _doc()), None)
    for version in ("0.32.0", "0.33.0", "0.34.0"):
        try:
            release = open_release(version)
        except ReleaseError as exc:
            pytest.skip(str(exc))
        _, said = examine(release, validate(Patch, _doc()), pins, installed_static())
        assert [b for b in said if b.breaking] == [], (version, said)


def test_an_override_that_does_not_take_vllms_call_is_broken_for_check_and_the_loader(tmp_path):
    _, said = examine(installed_static(), validate(Patch, _doc("NarrowConnector", ["get_finished"])), None)
    [b] = [b for b in said if b.breaking]
    assert b.kind is BreakageKind.convention_mismatch and "finished_req_ids" in b.explain()
    loader = make_loader(tmp_path, {"conn": _doc("NarrowConnector", ["get_finished"])},
                         [{"patch": "conn@1", "targets": _pins(["get_finished"])}], role="worker")
    loader.run_import_stage()
    rec = loader.records["conn"]
    assert rec.state == "failed" and rec.code == "convention" and "finished_req_ids" in rec.reason


def test_a_changed_base_method_is_refused_at_start_up(tmp_path):
    pins = _pins()
    pins[f"{BASE}.get_finished"] = {**pins[f"{BASE}.get_finished"], "signature": "(self, finished_req_ids, step)"}
    loader = make_loader(tmp_path, {"conn": _doc()}, [{"patch": "conn@1", "targets": pins}], role="worker")
    loader.run_import_stage()
    rec = loader.records["conn"]
    assert rec.state == "failed" and rec.code == "fingerprint" and "get_finished" in rec.reason


def test_the_loader_verifies_it_and_installs_nothing(tmp_path):
    before = dict(vars(KVConnectorBase_V1)), dict(vars(PluginConnector))
    loader = make_loader(tmp_path, {"conn": _doc()}, [{"patch": "conn@1", "targets": _pins()}], role="worker")
    loader.run_import_stage()
    rec = loader.records["conn"]
    assert rec.state == "applied", rec
    assert rec.detail["hooks"] == [f"{__name__}:PluginConnector.get_finished",
                                   f"{__name__}:PluginConnector.wait_for_save"]
    assert (dict(vars(KVConnectorBase_V1)), dict(vars(PluginConnector))) == before


def test_a_class_that_is_no_subclass_of_the_base_is_refused(tmp_path):
    loader = make_loader(tmp_path, {"conn": _doc("NotAConnector", ["get_finished"])},
                         [{"patch": "conn@1", "targets": _pins(["get_finished"])}], role="worker")
    loader.run_import_stage()
    rec = loader.records["conn"]
    assert rec.state == "failed" and rec.code == "implementation" and "not a subclass" in rec.reason


def test_hook_needs_a_class_target_an_implementation_and_overrides():
    from vllm_patchkit.declaration.errors import DeclarationError

    base = dict(id="bad", processes=["worker"], kind="hook")
    for extra, words in (({"target": BASE, "implementation": f"{__name__}:PluginConnector"}, "needs 'overrides'"),
                         ({"target": f"{BASE}.get_finished", "implementation": f"{__name__}:PluginConnector",
                           "overrides": ["get_finished"]}, "needs 'target' to name a class"),
                         ({"target": BASE, "implementation": f"{__name__}:PluginConnector",
                           "overrides": ["get_finished"], "config_field": "kv_transfer_config.kv_connector"},
                          "'config_field' is only for kind subclass")):
        with pytest.raises((DeclarationError, ValueError), match=words):
            validate(Patch, patch_doc(**base, **extra))
