"""A replacement (or an override) is judged against the calls vLLM makes to it, not against everything its
definition would accept (issue 31, item 2). The real case, ROCm/ATOM's `ParserManager.get_parser` wrapper (tests/
corpus/atom, atom-088): five keywords, then `**kwargs`; vLLM's target takes `tool_strict_level` (0.31.0) and
`tokenizer` (0.32.0 on) at positions 6 and 7, and every one of vLLM's five calls passes them by keyword. Before,
`check` said `does not accept parameter 'tool_strict_level' positionally ... vLLM's positional call raises
TypeError (breaking)` on every release — a call vLLM never makes. The facts are pinned (`call_positional`,
`call_keywords`), so the loader judges exactly as check does; the real break of a call vLLM does make stays.
"""

from __future__ import annotations

import pytest

from vllm_patchkit.declaration.pins import Fingerprint, ManifestEntry
from vllm_patchkit.tools.examine import examine
from vllm_patchkit.tools.releases import ReleaseError, StaticView, installed_static, installed_version, open_release
from vllm_patchkit.tools.static import StaticRelease
from vllm_patchkit.upstream import convention
from vllm_patchkit.upstream.findings import BreakageKind

pytestmark = pytest.mark.skipif(installed_version() != "0.31.0", reason="read against vLLM 0.31.0")
GET_PARSER = "vllm.parser.parser_manager:ParserManager.get_parser"
WRAPPER = "(cls, tool_parser_name=None, reasoning_parser_name=None, enable_auto_tools=False, model_name=None, " \
          "is_harmony=False, **kwargs)"


def _atom_088():
    from tests.corpus.catalogue import load

    cat = load("atom")
    return cat.patch(next(p for p in cat.places if p.id == "atom-088"))


def test_vllms_calls_are_read_and_pinned():
    found, said = examine(installed_static(), _atom_088(), None)
    pin = found[GET_PARSER]
    assert pin.call_positional == 0 and "tool_strict_level" in pin.call_keywords
    assert [b for b in said if b.breaking] == []


def test_a_parameter_vllm_passes_only_by_keyword_is_no_break_on_any_release():
    pins, _ = examine(installed_static(), _atom_088(), None)
    for version in ("0.32.0", "0.33.0", "0.34.0"):
        try:
            release = open_release(version)
        except ReleaseError as exc:
            pytest.skip(str(exc))
        _, said = examine(release, _atom_088(), pins, installed_static())
        assert not [b for b in said if b.kind is BreakageKind.convention_mismatch], (version, said)


def test_without_the_facts_every_call_the_signature_admits_is_judged():
    """What the rule must not hide: with no facts (a name that escapes, a nearest release) the positional call the
    signature admits is judged, as before."""
    import inspect

    sig = inspect.Signature.from_callable(eval(f"lambda {WRAPPER[1:-1]}: None"))
    target = "(cls, tool_parser_name=None, reasoning_parser_name=None, enable_auto_tools=False, model_name=None, " \
             "is_harmony=False, tool_strict_level='auto')"
    every = convention.problems(sig, target, shape="replace", target_kind="classmethod")
    assert [f.code for f in every] == ["not_positional"] and every[0].where == "tool_strict_level"
    assert convention.problems(sig, target, shape="replace", target_kind="classmethod",
                               calls=(0, ("tool_strict_level",))) == []
    # a call passing six positional arguments reaches tool_strict_level's position: the problem stands
    assert convention.problems(sig, target, shape="replace", target_kind="classmethod",
                               calls=(6, ())) == every


def test_a_keyword_vllm_passes_keeps_the_real_break():
    """value-steer's override of initialize_kv_cache takes no `is_profiling`; vLLM 0.31.0 calls it with
    is_profiling=True: the facts hold that keyword, so the break stays (tests/contracts/test_override_convention.py)."""
    from tests.corpus.catalogue import load

    cat = load("value_steer")
    patch = cat.patch(next(p for p in cat.places if p.id == "vfd-runner"))
    found, said = examine(installed_static(), patch, None)
    spec = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache"
    assert "is_profiling" in (found[spec].call_keywords or [])
    [b] = [b for b in said if b.kind is BreakageKind.convention_mismatch]
    assert b.breaking and "is_profiling" in b.detail


def test_a_name_that_escapes_as_a_value_is_not_read(tmp_path):
    """A function vLLM hands around (registered as a fallback, stored) may be called under another name: no facts."""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text("def kernel(a, b, block_size=16):\n    return a\n\n"
                              "def direct(x):\n    return x\n\n"
                              "FALLBACKS = {'cpu': kernel}\n\n"
                              "def run(a, b):\n    return direct(a), kernel(a, b=b)\n")
    view = StaticView(StaticRelease.open(tmp_path, "9.9.9"))
    assert view.calls("vllm.k:kernel") is None  # stored in FALLBACKS
    facts = view.calls("vllm.k:direct")
    assert (facts.positional, facts.keywords, facts.sites) == (1, (), 1)
    assert view.calls("vllm.k:run") is None  # never called by name in the release


def test_the_loader_judges_with_the_pinned_facts_and_a_nearest_release_without_them():
    from vllm_patchkit.runtime import nearest

    pin = Fingerprint(kind="classmethod", signature="(cls, a=None, b='x')", call_positional=0, call_keywords=["b"])
    entry = ManifestEntry(patch="p@1", targets={GET_PARSER: pin})
    stripped = nearest.without_calls(entry)
    assert stripped.targets[GET_PARSER].call_positional is None
    assert stripped.targets[GET_PARSER].signature == pin.signature
    assert convention.pinned_calls(pin) == (0, ("b",)) and convention.pinned_calls(stripped.targets[GET_PARSER]) is None


def test_the_loader_refuses_or_accepts_as_check_does():
    """verify() on the real ParserManager.get_parser with the pin check wrote: accepted with the facts (vLLM's calls
    are all by keyword), refused — in check's old words — where a nearest release's pins drop them."""
    from vllm_patchkit.runtime import nearest
    from vllm_patchkit.runtime.verify import verify
    from vllm_patchkit.upstream.findings import Finding

    patch = _atom_088()
    found, _ = examine(installed_static(), patch, None)
    entry = ManifestEntry(patch=patch.key, targets=found)
    assert not isinstance(verify(patch, entry), Finding)
    refused = verify(patch, nearest.without_calls(entry))
    assert isinstance(refused, Finding) and refused.code == "convention"
    assert "'tool_strict_level' positionally" in refused.reason
