"""The preconditions' table (declaration/precondition_table.py) is the one place a precondition is declared: the
validating model's field, the objects' field, the stage, the fact's reader, the judge and the words all come from
its row. These tests hold every row, present and future, to the rule a reader of `when` relies on: a fact this
release does not let the framework read is unknown, never unmet."""

from __future__ import annotations

import types

import pytest

from vllm_patchkit.declaration import validation
from vllm_patchkit.declaration.precondition_table import CONFIG_STAGE, IMPORT_STAGE, PRECONDITIONS, Unknown, Unmet
from vllm_patchkit.declaration.preconditions import Facts, config_facts, held, unmet_at_config, unmet_at_import
from vllm_patchkit.declaration.schema import Patch, When

#: a wanted value for each row (a new row must add one: the tests below then judge it too)
WANT = {"vllm": ">=0.31", "platform": ["cpu"], "env": {"X_FLAG": "1"}, "architectures": ["LlamaForCausalLM"],
        "served_by": "vllm", "runner": "v1", "prefix_caching": True, "speculative": False,
        "cudagraph_mode": ["FULL"]}


def test_every_row_is_a_field_of_both_sides_in_the_tables_order():
    names = [row.name for row in PRECONDITIONS]
    assert names == list(validation.When.model_fields) == list(When.__struct_fields__)
    assert set(WANT) == set(names), "give the new row a wanted value in WANT"


def test_the_stage_a_patch_is_decided_at_follows_the_rows():
    for row in PRECONDITIONS:
        patch = Patch(id="p", version=1, summary="s", kind="wrap", processes=["worker"], required=False,
                      when=When(**{row.name: WANT[row.name]}))
        assert patch.stage == row.stage, row.name


@pytest.mark.parametrize("row", CONFIG_STAGE, ids=[r.name for r in CONFIG_STAGE])
def test_a_config_fact_that_cannot_be_read_is_unknown_never_unmet(row):
    """The fact None (the release removed what the reader reads) with every other fact known and holding."""
    config = {"architectures": ["LlamaForCausalLM"], "served_by": {"LlamaForCausalLM": "vllm.models.llama"},
              "runner": "v1", "prefix_caching": True, "speculative": False, "cudagraph_mode": "FULL"}
    when = When(**{row.name: WANT[row.name]})
    assert unmet_at_config(when, config) is None, "the facts above must satisfy WANT"
    config[row.name] = None if row.name != "served_by" else {"LlamaForCausalLM": None}
    judged = unmet_at_config(when, config)
    assert isinstance(judged, Unknown) and judged.field == row.name


def test_a_known_false_part_decides_over_an_unknown_one():
    config = {"architectures": None, "served_by": {}, "runner": "v2", "prefix_caching": None}
    when = When(architectures=["LlamaForCausalLM"], runner="v1", prefix_caching=True)
    assert unmet_at_config(when, config) == Unmet("runner", "v1", "v2")


def test_an_import_fact_that_cannot_be_read_is_unknown():
    facts = Facts(vllm_version="0.31.0", platform=None, role="worker", env={"X_FLAG": "1"})
    assert [row.name for row in IMPORT_STAGE] == ["vllm", "platform", "env"]
    assert unmet_at_import(When(vllm=">=0.31", env={"X_FLAG": "1"}), facts) is None
    assert isinstance(unmet_at_import(When(platform=["cpu"]), facts), Unknown)
    assert unmet_at_import(When(vllm=">=0.32"), facts) == Unmet("vllm", ">=0.32", "0.31.0")


def test_config_facts_read_one_fact_per_row_and_none_where_a_release_lacks_it():
    """A VllmConfig stand-in without the fields a reader reads: every fact None (unknown), none guessed."""
    facts = config_facts(types.SimpleNamespace())
    assert list(facts) == [row.name for row in CONFIG_STAGE]
    assert facts["architectures"] is None and facts["served_by"] == {} and facts["prefix_caching"] is None
    assert facts["speculative"] is None and facts["cudagraph_mode"] is None


def test_held_words_follow_the_rows():
    config = {"architectures": ["A", "B"], "served_by": {"A": "plug.a"}, "prefix_caching": True}
    when = When(architectures=["A"], served_by="out_of_tree", prefix_caching=True, env={"X_FLAG": None})
    assert held(when, config) == "architecture A; served by plug.a (out_of_tree); prefix_caching True; X_FLAG=None"
