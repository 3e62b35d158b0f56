"""Write the JSON Schemas generated from the validating models (validation.py; committed, for editors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.features import Feature
from vllm_patchkit.declaration.validation import Manifest, Patch

HERE = Path(__file__).resolve().parent.parent / "json_schema"


def json_schemas() -> dict[str, dict]:
    """JSON Schemas for editors, generated from the models of each declaration file."""
    return {"patch": Patch.model_json_schema(), "manifest": Manifest.model_json_schema(),
            "feature": Feature.model_json_schema()}


def write_schemas(out: Optional[Path] = None) -> list[Path]:
    out = out or HERE
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in json_schemas().items():
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        paths.append(path)
    return paths
