"""`kind: set` + `adds: true`: a name a plugin adds to a vLLM class (issue 31, item 4). The real case: vllm-hi
(tests/corpus/vllm_hi) adds seven RPC methods to `EngineCore` and the GPU `Worker`; before, `pin` said "the place
the patch is installed at is gone" (it never existed) and marking it not applicable made every later release report
it broken. Now the name is pinned as absent, and a release that starts defining it is a collision: vLLM 0.32.0 added
`EngineCore.compute_weight_checksums` (a name a plugin could well have added first). On the real classes: the
installed 0.31.0 (statically and live) and the 0.32.0 wheel.
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.validation import validate
from vllm_patchkit.runtime.verify import verify
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import ReleaseError, installed_static, installed_version, open_release
from vllm_patchkit.upstream.findings import BreakageKind, Finding
from vllm_patchkit.tools.manifest_files import dump_fingerprint

from .helpers import make_loader, patch_doc

pytestmark = [pytest.mark.usefixtures("undo_every_loader"),
              pytest.mark.skipif(installed_version() != "0.31.0", reason="names read against vLLM 0.31.0")]
CORE = "vllm.v1.engine.core:EngineCore"
ADDED = f"{CORE}.patchkit_resume_requests"  # defined by no release
LATER = f"{CORE}.compute_weight_checksums"  # 0.32.0 defines it


def rpc(self, *args):
    """The method the test plugin adds (value_from)."""
    return ("resumed", args)


def _doc(pid: str, target: str, **extra) -> dict:
    return patch_doc(id=pid, kind="set", target=target, adds=True, value_from=f"{__name__}:rpc",
                     processes=["engine_core"], **extra)


def _check(release, doc, pins=None, base=None):
    patch = validate(Patch, doc)
    return examine(release, patch, pins, base) if pins is not None else examine(release, patch, None)


def test_an_added_name_is_pinned_absent():
    found, said = _check(installed_static(), _doc("add", ADDED))
    assert said == [] and found == {ADDED: Fingerprint(kind="absent")}


def test_a_name_a_later_release_defines_is_a_collision_there():
    try:
        v032 = open_release("0.32.0")
    except ReleaseError as exc:
        pytest.skip(str(exc))
    found, said = _check(installed_static(), _doc("add", LATER))
    assert said == []  # 0.31.0 has no such method
    _, said = _check(v032, _doc("add", LATER), found, installed_static())
    [b] = said
    assert b.kind is BreakageKind.name_collision and b.breaking
    assert b.explain() == (f"{LATER}: add@1 adds compute_weight_checksums to EngineCore, and vLLM 0.32.0 defines "
                           "EngineCore.compute_weight_checksums itself: the name the plugin adds would replace vLLM's "
                           "own, which vLLM's code then no longer reaches (a collision)")


def test_a_name_the_class_has_or_inherits_already_is_refused_by_check_and_the_loader_alike():
    own = f"{CORE}.add_request"
    inherited = "vllm.v1.engine.core:EngineCoreProc.add_request"  # EngineCoreProc inherits EngineCore's
    for target, where in ((own, own), (inherited, f"{CORE}.add_request")):
        doc = _doc("add", target)
        _, said = _check(installed_static(), doc)
        [b] = said
        assert b.kind is BreakageKind.name_collision and b.new == where
        got = verify(validate(Patch, doc), validate(ManifestEntry, {"patch": "add@1",
                                                                    "targets": {target: {"kind": "absent"}}}))
        assert isinstance(got, Finding) and got.code == "collision" and got.reason == b.explain()


def test_the_loader_adds_it_and_unpatch_takes_it_away(tmp_path):
    from vllm.v1.engine.core import EngineCore

    doc = _doc("add", ADDED)
    pins = {ADDED: dump_fingerprint(Fingerprint(kind="absent"))}
    loader = make_loader(tmp_path, {"add": doc}, [{"patch": "add@1", "targets": pins}], role="engine_core")
    loader.run_import_stage()
    rec = loader.records["add"]
    assert rec.state == "applied", rec
    assert EngineCore.__dict__["patchkit_resume_requests"] is rpc
    loader.unpatch()
    assert "patchkit_resume_requests" not in EngineCore.__dict__ and not hasattr(EngineCore, "patchkit_resume_requests")


def test_adds_is_for_a_class_member_of_kind_set_alone():
    from vllm_patchkit.declaration.errors import DeclarationError

    for bad, words in ((dict(kind="wrap", target=ADDED, adds=True), "'adds: true' is only for kind set"),
                       (dict(kind="set", target="vllm.v1.engine.core:EngineCore", adds=True, value=1),
                        "needs 'target' to name a member of a class"),
                       (dict(kind="set", target=ADDED, adds=True, instances=True, value=1), "not with 'instances'")):
        with pytest.raises((DeclarationError, ValueError), match=words):
            validate(Patch, patch_doc(id="bad", processes=["engine_core"], **bad))
