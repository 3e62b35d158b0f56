"""The requirement line's rule (tools/requirement.py) on synthetic verdicts: which examined releases are supported
is given; the line must admit exactly those of the examined ones and claim nothing above the newest supported."""

from __future__ import annotations

import itertools

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from vllm_patchkit.tools.requirement import requirement

EXAMINED = ["0.31.0", "0.32.0", "0.33.0", "0.34.0"]


def spec(line: str) -> SpecifierSet:
    assert line.startswith("vllm")
    return SpecifierSet(line[len("vllm"):])


def admits(line: str, version: str) -> bool:
    return spec(line).contains(Version(version), prereleases=True)


def test_contiguous():
    req = requirement(EXAMINED, EXAMINED)
    assert req.line == "vllm>=0.31.0,<=0.34.0"
    assert req.supported == tuple(EXAMINED) and req.unsupported == () and req.excluded == ()
    assert not admits(req.line, "0.34.1") and not admits(req.line, "0.35.0")  # nobody examined them
    assert not admits(req.line, "0.30.9")
    assert req.wider == "vllm>=0.31.0,<0.35" and admits(req.wider, "0.34.1")  # the conventional form, as a note only
    assert any("0.34.0" in n and "nobody examined" in n for n in req.notes)


def test_newest_broken_upper_bound_stops_at_newest_supported():
    req = requirement(EXAMINED, EXAMINED[:3])
    assert req.line == "vllm>=0.31.0,<=0.33.0"
    assert req.unsupported == ("0.34.0",)
    assert not admits(req.line, "0.33.1")  # between the newest supported and a broken one: never claimed
    assert req.wider == "vllm>=0.31.0,<0.34.0"  # stops at the first examined release above


def test_a_hole_excludes_the_whole_minor_series():
    req = requirement(EXAMINED, ["0.31.0", "0.33.0", "0.34.0"])
    assert req.line == "vllm>=0.31.0,<=0.34.0,!=0.32.*"
    assert not admits(req.line, "0.32.0") and not admits(req.line, "0.32.1")  # 0.32.1: beside a broken release
    assert admits(req.line, "0.31.0") and admits(req.line, "0.33.0") and admits(req.line, "0.34.0")
    assert req.excluded == (("!=0.32.*", "examined, not supported: 0.32.0"),)


def test_a_hole_inside_a_series_with_a_supported_release_is_excluded_exactly():
    examined = ["0.32.0", "0.32.1", "0.32.2"]
    req = requirement(examined, ["0.32.0", "0.32.2"])
    assert req.line == "vllm>=0.32.0,<=0.32.2,!=0.32.1"


def test_none_supported():
    req = requirement(EXAMINED, [])
    assert req.line is None and req.wider is None
    assert req.unsupported == tuple(EXAMINED)
    assert "no examined release is supported" in req.notes[0]


def test_only_the_newest():
    req = requirement(EXAMINED, ["0.34.0"])
    assert req.line == "vllm==0.34.0"
    assert not admits(req.line, "0.34.1") and not admits(req.line, "0.33.0")


def test_an_unexamined_minor_series_between_supported_releases_is_never_claimed():
    req = requirement(["0.31.0", "0.33.0"], ["0.31.0", "0.33.0"])
    assert req.line == "vllm>=0.31.0,<=0.33.0,!=0.32.*"
    assert not admits(req.line, "0.32.0")
    assert req.excluded == (("!=0.32.*", "no release of the series was examined"),)


def test_unsupported_releases_below_the_oldest_supported_need_no_clause():
    req = requirement(EXAMINED, ["0.33.0", "0.34.0"])
    assert req.line == "vllm>=0.33.0,<=0.34.0"


def test_a_dev_build_examined():
    req = requirement(["0.33.0", "0.34.1.dev12+gabc"], ["0.33.0", "0.34.1.dev12+gabc"])
    assert admits(req.line, "0.34.1.dev12+gabc") and not admits(req.line, "0.34.1")


def test_a_supported_release_must_have_been_examined():
    with pytest.raises(ValueError, match="not examined: 0.35.0"):
        requirement(EXAMINED, ["0.35.0"])


@pytest.mark.parametrize("mask", list(itertools.product([False, True], repeat=6)))
def test_every_verdict_pattern_admits_exactly_the_supported_examined_releases(mask):
    examined = ["0.30.0", "0.31.0", "0.31.2", "0.33.0", "0.34.0", "0.36.1"]
    good = [v for v, m in zip(examined, mask) if m]
    req = requirement(examined, good)
    if not good:
        assert req.line is None
        return
    assert [v for v in examined if admits(req.line, v)] == good
    newest = max(good, key=Version)
    assert not admits(req.line, str(Version(newest).major) + "." + str(Version(newest).minor) + ".99")
    for between in ("0.32.0", "0.35.0"):  # minor series nobody examined
        assert not admits(req.line, between)


def test_a_dev_build_above_the_newest_supported():
    req = requirement(["0.33.0", "0.34.1.dev12+gabc"], ["0.33.0"])
    assert req.line == "vllm==0.33.0" and req.wider == "vllm>=0.33.0,<0.34.1.dev12"
