"""The corpus catalogues: each validates, each declaration builds a Patch, each target exists in the installed
0.31.0 source (read statically: vLLM is never imported), each truth covers both releases with a reason."""

from __future__ import annotations

import pytest
import yaml

from vllm_patchkit.tools.releases import installed_root
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream.static_source import DirSource

from tests.corpus.catalogue import HERE, RELEASES, all_catalogues, load, plugins

PLUGINS = plugins()


def test_enough_plugins():
    assert len([p for p in PLUGINS if p != "atom"]) >= 3, PLUGINS


@pytest.fixture(scope="module")
def release():
    root = installed_root()
    if root is None:
        pytest.skip("vLLM is not installed")
    rel = StaticRelease(DirSource(root))
    if rel.version() != "0.31.0":
        pytest.skip(f"the catalogues are named at vLLM 0.31.0; installed is {rel.version()}")
    return rel


@pytest.mark.parametrize("plugin", PLUGINS)
def test_validates_and_builds(plugin):
    cat = load(plugin)
    patches = cat.patches()
    assert all(isinstance(p, Patch) for p in patches)
    assert len({p.id for p in patches}) == len(patches)
    for place in cat.places:
        if place.declaration is not None:
            assert cat.patch(place).id == f"{plugin.replace('_', '-')}-{place.id}"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_truth_has_both_releases(plugin):
    for place in load(plugin).places:
        assert set(place.truth) == set(RELEASES), place.id
        for r in RELEASES:
            assert place.truth[r].reason.strip(), (place.id, r)


def _exists(release: StaticRelease, spec: str) -> bool:
    r = release.resolve(spec)
    if not isinstance(r, Missing):
        return True
    return bool(r.inherited_from) or r.unreadable


@pytest.mark.parametrize("plugin", PLUGINS)
def test_targets_exist_at_0_31_0(plugin, release):
    cat = load(plugin)
    absent = []
    for place in cat.places:
        specs = [place.target]
        if place.declaration is not None:
            p = cat.patch(place)
            added = {p.target} if p.adds else set()  # a name the plugin adds: absent at 0.31.0 by declaration
            specs += [s for s in p.pinned_specs if s not in specs and s not in added]
        for spec in specs:
            if not _exists(release, spec):
                absent.append(f"{place.id}: {spec}")
    assert not absent, f"{plugin}: not in vLLM 0.31.0: {absent}"


def test_all_catalogues_load():
    assert [c.plugin for c in all_catalogues()]


def test_errors_name_the_file_and_the_place(tmp_path):
    import yaml

    from tests.corpus.catalogue import HERE

    raw = yaml.safe_load((HERE / "flash_head" / "catalogue.yaml").read_text())
    raw["places"][1]["typo_key"] = 1
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "catalogue.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError) as exc:
        load("broken", root=tmp_path)
    assert "broken/catalogue.yaml" in str(exc.value) and "'sampler-forward'" in str(exc.value)
    assert "typo_key" in str(exc.value)


@pytest.mark.parametrize("bad, said", [
    ({"where": "x.py:1", "name": "vllm.a:B", "release": "0.35.0", "breaks": True, "reason": "r"}, "release"),
    ({"where": "x.py", "name": "vllm.a:B", "release": "0.33.0", "breaks": True, "reason": "r"}, "where"),
    ({"where": "x.py:1", "name": "vllm.a:B", "release": "0.33.0", "breaks": "yes", "reason": "r"}, "breaks"),
    ({"where": "x.py:1", "name": "vllm.a:B", "release": "0.33.0", "breaks": True}, "reason"),
    ({"where": "x.py:1", "name": "vllm.a:B", "release": "0.33.0", "breaks": True, "reason": "r", "why": "?"}, "why"),
])
def test_a_bad_reach_judgement_is_named(tmp_path, bad, said):
    raw = yaml.safe_load((HERE / "flash_head" / "catalogue.yaml").read_text())
    raw["reach"] = [bad]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "catalogue.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError) as exc:
        load("broken", root=tmp_path)
    assert str(exc.value).startswith("broken/catalogue.yaml: reach[0] (") and said in str(exc.value), exc.value


def test_a_reach_line_judged_twice_is_refused(tmp_path):
    raw = yaml.safe_load((HERE / "flash_head" / "catalogue.yaml").read_text())
    raw["reach"] = [raw["reach"][0], dict(raw["reach"][0], breaks=False)]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "catalogue.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="judged twice"):
        load("broken", root=tmp_path)
