"""The set's own ordinary tests; its lifecycle and contract items come from `patchkit_sets` (../pytest.ini).

Collected also by the repository's whole run (its testpaths include tests/plugins), where the set
is not installed: skipped there. Run for real by tests/e2e/test_patch_sets_e2e.py.
"""

from importlib import metadata

import pytest

from vllm_patchkit import PATCH_SETS_GROUP, discover_sets

pytestmark = pytest.mark.skipif("other" not in {ep.name for ep in metadata.entry_points(group=PATCH_SETS_GROUP)},
                                reason="the patch set `other` is not installed (tests/e2e installs it)")


def test_the_set_is_found_by_its_entry_point_name():
    (other,) = [s for s in discover_sets(["other"], with_env=False) if s.name == "other"]
    assert (other.patches / "schedule_counter.yaml").is_file()
    assert (other.manifests / "vllm-0.31.0.yaml").is_file()
