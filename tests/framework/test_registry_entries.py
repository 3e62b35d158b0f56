"""`kind: register`: one entry of a mapping vLLM looks keys up in (issue 31, item 4: "a run-time registry entry").
The real registry: `MODEL_ARCH_CONFIG_CONVERTORS` (hf `model_type` -> convertor class; vLLM's ModelConfig looks the
model's type up in it), into which ROCm/ATOM registers its GLM-5 convertor. Real releases, real changes: 0.32.0
starts registering `longcat_flash` itself (a plugin that added it on 0.31.0 now collides), 0.33.0 drops `medusa` (a
plugin that replaced vLLM's entry finds it gone). Pinned is whether vLLM registers the key, never the mapping's
value (every new registration upstream would change it).
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.validation import validate
from vllm_patchkit.runtime.verify import verify
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.manifest_files import dump_fingerprint
from vllm_patchkit.tools.releases import ReleaseError, StaticView, installed_static, installed_version, open_release
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.findings import BreakageKind, Finding

from .helpers import make_loader, patch_doc

pytestmark = [pytest.mark.usefixtures("undo_every_loader"),
              pytest.mark.skipif(installed_version() != "0.31.0", reason="keys read against vLLM 0.31.0")]
REGISTRY = "vllm.transformers_utils.model_arch_config_convertor:MODEL_ARCH_CONFIG_CONVERTORS"


def _convertor():
    import vllm.config  # noqa: F401  (vLLM's own import order: the convertor module is imported by the config)
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    return type("PluginConvertor", (ModelArchConfigConvertorBase,), {})


PluginConvertor = _convertor()


def _doc(entry: str, adds: bool = True, **extra) -> dict:
    fields = dict(id="conv", kind="register", target=REGISTRY, entry=entry, value_from=f"{__name__}:PluginConvertor",
                  processes=["frontend"], **extra)
    return patch_doc(**fields, **({"adds": True} if adds else {}))


def _check(release, doc, pins=None, base=None):
    patch = validate(Patch, doc)
    return examine(release, patch, pins, base) if pins is not None else examine(release, patch, None)


def _release(version: str):
    try:
        return open_release(version)
    except ReleaseError as exc:
        pytest.skip(str(exc))


def test_a_key_vllm_does_not_register_is_pinned_absent_and_the_mapping_is_not_value_pinned():
    found, said = _check(installed_static(), _doc("glm5"))
    assert said == [] and found == {REGISTRY: Fingerprint(kind="attribute", entry_present=False)}
    found, said = _check(installed_static(), _doc("medusa", adds=False))  # replacing vLLM's own entry
    assert said == [] and found == {REGISTRY: Fingerprint(kind="attribute", entry_present=True)}


def test_a_key_a_later_release_registers_is_a_collision_there():
    pins, said = _check(installed_static(), _doc("longcat_flash"))
    assert said == []  # 0.31.0 does not register it
    _, said = _check(_release("0.32.0"), _doc("longcat_flash"), pins, installed_static())
    [b] = said
    assert b.kind is BreakageKind.entry_collision and b.breaking
    assert b.explain() == (f"{REGISTRY}: conv@1 registers 'longcat_flash' in {REGISTRY}, and vLLM 0.32.0 registers "
                           "that key itself: the plugin's entry would replace vLLM's own, which vLLM then no longer "
                           "reaches (a collision)")


def test_an_entry_the_plugin_replaces_that_a_later_release_drops_is_gone_there():
    pins, said = _check(installed_static(), _doc("medusa", adds=False))
    assert said == []
    _, said = _check(_release("0.32.0"), _doc("medusa", adds=False), pins, installed_static())
    assert said == []  # still registered on 0.32.0
    _, said = _check(_release("0.33.0"), _doc("medusa", adds=False), pins, installed_static())
    [b] = said
    assert b.kind is BreakageKind.entry_gone and b.breaking and "no longer registers that key" in b.explain()


def test_a_key_already_registered_is_refused_by_check_and_the_loader_alike():
    doc = _doc("deepseek_v4")  # 0.31.0 registers it: `adds` is untrue
    _, said = _check(installed_static(), doc)
    [b] = said
    assert b.kind is BreakageKind.entry_collision
    got = verify(validate(Patch, doc), validate(ManifestEntry, {
        "patch": "conv@1", "targets": {REGISTRY: {"kind": "attribute", "entry_present": False}}}))
    assert isinstance(got, Finding) and got.code == "collision"
    assert got.reason.startswith(b.explain()) and (got.expected, got.found) == ("'deepseek_v4' absent",
                                                                                "'deepseek_v4' present")


def test_what_the_source_does_not_spell_is_unread_never_absent(tmp_path):
    """A mapping filled in a loop (or by a computed key) cannot say a key is absent: `entry_unreadable`,
    breaking, naming why. (A tree written here: the point is the reader's rule, not a vLLM module.)"""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "reg.py").write_text("LITERAL = {'a': 1}\nLITERAL['b'] = 2\nFILLED = {'a': 1}\n"
                                "for k in ('x', 'y'):\n    FILLED[k] = 0\n")
    view = StaticView(StaticRelease.open(tmp_path, "9.9.9"))
    assert view.entry("vllm.reg:LITERAL", "b") is True and view.entry("vllm.reg:LITERAL", "x") is False
    assert view.entry("vllm.reg:FILLED", "a") is True
    doc = _doc("x") | {"target": "vllm.reg:FILLED"}
    found, said = _check(view, doc)
    [b] = said
    assert b.kind is BreakageKind.entry_unreadable and b.breaking
    assert found["vllm.reg:FILLED"].entry_present is None


def test_the_loader_registers_it_vllm_finds_it_and_unpatch_takes_it_away(tmp_path):
    from vllm.transformers_utils.model_arch_config_convertor import (MODEL_ARCH_CONFIG_CONVERTORS,
                                                                      ModelArchConfigConvertorBase)

    pins = {REGISTRY: dump_fingerprint(Fingerprint(kind="attribute", entry_present=False))}
    loader = make_loader(tmp_path, {"conv": _doc("glm5")}, [{"patch": "conv@1", "targets": pins}])
    loader.run_import_stage()
    rec = loader.records["conv"]
    assert rec.state == "applied", rec
    # vLLM's ModelConfig.get_model_arch_config looks the model type up exactly so
    assert MODEL_ARCH_CONFIG_CONVERTORS.get("glm5", ModelArchConfigConvertorBase) is PluginConvertor
    loader.unpatch()
    assert "glm5" not in MODEL_ARCH_CONFIG_CONVERTORS


def test_the_loader_puts_back_the_entry_it_replaced(tmp_path):
    from vllm.transformers_utils.model_arch_config_convertor import MODEL_ARCH_CONFIG_CONVERTORS

    before = MODEL_ARCH_CONFIG_CONVERTORS["medusa"]
    pins = {REGISTRY: dump_fingerprint(Fingerprint(kind="attribute", entry_present=True))}
    loader = make_loader(tmp_path, {"conv": _doc("medusa", adds=False)}, [{"patch": "conv@1", "targets": pins}])
    loader.run_import_stage()
    assert loader.records["conv"].state == "applied"
    assert MODEL_ARCH_CONFIG_CONVERTORS["medusa"] is PluginConvertor
    loader.unpatch()
    assert MODEL_ARCH_CONFIG_CONVERTORS["medusa"] is before


def test_a_pin_that_does_not_say_whether_vllm_registers_it_is_refused(tmp_path):
    """A fact the pin does not hold is never taken as "absent": re-pin."""
    pins = {REGISTRY: dump_fingerprint(Fingerprint(kind="attribute"))}
    loader = make_loader(tmp_path, {"conv": _doc("glm5")}, [{"patch": "conv@1", "targets": pins}])
    loader.run_import_stage()
    rec = loader.records["conv"]
    assert rec.state == "failed" and rec.code == "fingerprint" and "re-pin the release" in rec.reason
    from vllm.transformers_utils.model_arch_config_convertor import MODEL_ARCH_CONFIG_CONVERTORS

    assert "glm5" not in MODEL_ARCH_CONFIG_CONVERTORS


def test_register_needs_a_mapping_an_entry_and_a_value():
    from vllm_patchkit.declaration.errors import DeclarationError

    base = dict(id="bad", processes=["frontend"], kind="register", target=REGISTRY)
    for extra, words in (({"value": 1}, "kind 'register' needs 'entry'"),
                         ({"entry": "glm5"}, "needs 'value' or 'value_from'"),
                         ({"entry": "glm5", "value": 1, "instances": True}, "instances")):
        with pytest.raises((DeclarationError, ValueError), match=words):
            validate(Patch, patch_doc(**base, **extra))
    with pytest.raises((DeclarationError, ValueError), match="'entry' is only for kind register"):
        validate(Patch, patch_doc(id="bad", processes=["frontend"], kind="set", target=REGISTRY, entry="x", value=1))
