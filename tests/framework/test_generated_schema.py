"""The validating models (declaration/validation.py) are the one source of a declaration's fields: the objects every
process reads (declaration/schema.py, pins.py) and the editors' JSON Schemas are written from them by
`vllm-patchkit schema`, and committed. A field added to a model and not regenerated would be refused when a
cached object is read back, or dropped when a valid file is handed on."""

from __future__ import annotations

import json
import typing
from typing import Optional

from pydantic import Field

from vllm_patchkit.declaration import validation
from vllm_patchkit.tools import schema_objects
from vllm_patchkit.tools.schema_export import HERE, json_schemas


def test_the_committed_objects_are_what_the_models_give():
    assert schema_objects.stale_files() == [], "run `vllm-patchkit schema` and commit declaration/schema.py, pins.py"


def test_the_committed_json_schemas_are_what_the_models_give():
    for name, schema in json_schemas().items():
        path = HERE / f"{name}.schema.json"
        assert json.loads(path.read_text()) == schema, f"{path.name} is stale: run `vllm-patchkit schema`"


def test_a_field_added_to_a_model_is_written_into_its_object(monkeypatch, tmp_path):
    """The writer reads the model, not a list of its own: a new field (type, default) appears in the source."""

    class RetireWhen(validation.RetireWhen):
        """When the patch can go."""

        ticket: Optional[typing.Annotated[str, Field(min_length=1)]] = None
        weight: int = 3

    monkeypatch.setitem(schema_objects.FILES, "extra.py", ("An extra file.", (RetireWhen,)))
    source = schema_objects.source_of("extra.py")
    assert "    ticket: Optional[str] = None\n" in source
    assert "    weight: int = 3\n" in source
    assert source.startswith("# DO NOT EDIT")
    (tmp_path / "schema.py").write_text("stale\n")
    (tmp_path / "pins.py").write_text(schema_objects.source_of("pins.py"))
    assert [p.name for p in schema_objects.stale_files(tmp_path)] == ["schema.py", "extra.py"]
