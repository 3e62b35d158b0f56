"""Features: patches that make one change together (the image-publish patches, the versions of one hook) declare
what they share once, in their set's `features/<id>.yaml`: the upstream reference, when the feature retires, the
environment variables its patches read (one text each) and, unless a patch says its own, why. Reading a set fills
each member patch from its feature, so everything downstream sees complete patches; a member lists the variables
it reads by name (`reads_env`): a feature's variable is not read by every member (a worker-side hook reads none of
the scheduler's knobs). An environment variable is declared once in the whole set (a second declaration, even
with the same text, is an error naming both files)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import msgspec
from pydantic import Field

from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration import schema
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.vocabulary import PATCH_ID
from vllm_patchkit.declaration.validation import EnvVar, RetireWhen, Strict, to_object
from vllm_patchkit.declaration.yaml_files import parse_file

FOLDER = "features"  # inside a set's patches folder


class Feature(Strict):
    """What the patches of one feature share."""

    id: Annotated[str, Field(pattern=PATCH_ID)]
    summary: Annotated[str, Field(min_length=1)]
    why: Optional[Annotated[str, Field(min_length=1)]] = None
    upstream: Annotated[str, Field(min_length=1, description="issue/PR reference, or 'none: reason'")]
    retire_when: RetireWhen
    env_vars: list[EnvVar] = Field(default_factory=list)


def parse_feature(path: Path) -> Feature:
    feature = parse_file(path, Feature, "a mapping of feature fields")
    if feature.id != path.stem.replace("_", "-"):
        raise DeclarationError(str(path), "id", f"feature id {feature.id!r} does not match its file name "
                                                f"({path.name}: expected {path.stem.replace('_', '-')!r})")
    return feature


class EnvDeclarations:
    """Every environment variable declared in the sets being read: name -> (declaration, file)."""

    def __init__(self) -> None:
        self.declared: dict[str, tuple[schema.EnvVar, str]] = {}

    def declare(self, var: schema.EnvVar, file: str, field_name: str) -> Optional[DeclarationError]:
        first = self.declared.get(var.name)
        if first is not None and first[1] != file:
            return DeclarationError(file, field_name, f"{var.name} is already declared in {first[1]}: an environment "
                                    "variable is declared once, with one text (name it here as a string, or declare it "
                                    "in the patches' feature)")
        self.declared.setdefault(var.name, (var, file))  # the object a patch holds
        return None


def declare_own(patch: Patch, file: str, env: EnvDeclarations, errors: list) -> None:
    """The env vars the patch declares itself (before any patch's names are resolved: order of files is free)."""
    for i, var in enumerate(patch.env_vars):
        error = env.declare(var, file, f"env_vars[{i}]")
        if error is not None:
            errors.append(error)


def complete(patch: Patch, file: str, features: dict[str, tuple[Feature, str]], env: EnvDeclarations,
             errors: list) -> Optional[Patch]:
    """The patch with its feature's shared fields and its named env vars filled in (None: errors appended)."""
    update: dict = {}
    if patch.feature is not None:
        found = features.get(patch.feature)
        if found is None:
            errors.append(DeclarationError(file, "feature", f"unknown feature {patch.feature!r}: the set declares "
                                           f"{sorted(features) or 'none'} ({FOLDER}/<id>.yaml beside the patches)"))
            return None
        feature, _ = found
        update.update(upstream=feature.upstream, retire_when=to_object(feature.retire_when), why=patch.why or feature.why)
        if update["why"] is None:
            errors.append(DeclarationError(file, "why", f"missing: neither the patch nor its feature {feature.id!r} "
                                                        "says why"))
            return None
    resolved: list[schema.EnvVar] = list(patch.env_vars)
    names = {v.name for v in resolved}
    for i, name in enumerate(patch.reads_env):
        decl = env.declared.get(name)
        if decl is None:
            errors.append(DeclarationError(file, f"reads_env[{i}]", f"{name} is named but declared nowhere in the "
                                           "set (declare it once: name, default, doc)"))
            return None
        if name not in names:
            resolved.append(decl[0])
            names.add(name)
    update["env_vars"] = resolved
    return msgspec.structs.replace(patch, **update)


def read_features(folder: Path, env: EnvDeclarations, errors: list) -> dict[str, tuple[Feature, str]]:
    out: dict[str, tuple[Feature, str]] = {}
    for path in sorted((folder / FOLDER).glob("*.yaml")):
        try:
            feature = parse_feature(path)
        except PatchSetErrors as exc:
            errors.extend(exc.errors)
            continue
        except DeclarationError as exc:
            errors.append(exc)
            continue
        for i, var in enumerate(feature.env_vars):
            error = env.declare(to_object(var), str(path), f"env_vars[{i}]")
            if error is not None:
                errors.append(error)
        out[feature.id] = (feature, str(path))
    return out
