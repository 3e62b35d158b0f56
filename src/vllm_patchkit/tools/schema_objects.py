"""The objects every process reads (declaration/schema.py, declaration/pins.py), written from the validating models.

The validating models (declaration/validation.py, pydantic) are the one source of a declaration's fields: their
names, order, types, defaults and texts. A process served from the start-up cache must not define pydantic
models (~6 ms each process), so the same fields are also msgspec Structs: this module writes those Structs' source
from the models (`vllm-patchkit schema`), and a test fails when the committed files are not what it writes.
"""

from __future__ import annotations

import enum
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vllm_patchkit.declaration import validation

DECLARATION = Path(__file__).resolve().parent.parent / "declaration"

#: generated file -> (its docstring, the validating models it holds, in the order they are defined)
FILES: dict[str, tuple[str, tuple[type[BaseModel], ...]]] = {
    "schema.py": ("The patch as every process reads it: its fields, their types and defaults (the validating models "
                  "in validation.py\nsay what each may hold and why; readings.py what is derived from them).",
                  (validation.When, validation.EnvVar, validation.EnvDefault, validation.RetireWhen,
                   validation.Patch)),
    "pins.py": ("A manifest as every process reads it: which patch versions apply to one vLLM release and the pins "
                "(fingerprints)\neach was checked against (validation.py says what each field may hold and why).",
                (validation.Fingerprint, validation.ReachPin, validation.ManifestEntry, validation.NotApplicable,
                 validation.Manifest)),
}

_HEADER = ('# DO NOT EDIT: generated from declaration/validation.py by `vllm-patchkit schema`'
           ' (tools/schema_objects.py).\n')


def _spelled(value: Any) -> str:
    """A literal as the house writes it (double quotes)."""
    return f'"{value}"' if isinstance(value, str) and '"' not in value and "\\" not in value else repr(value)


class _Source:
    """The names one generated file's annotations and defaults refer to, gathered while it is written."""

    def __init__(self) -> None:
        self.typing: set[str] = set()
        self.vocabulary: set[str] = set()
        self.readings: set[str] = set()
        self.needs_field = False

    def annotation(self, tp: Any) -> str:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return self.annotation(args[0])
        if origin is typing.Union:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1 and len(rest) < len(args):
                self.typing.add("Optional")
                return f"Optional[{self.annotation(rest[0])}]"
            self.typing.add("Union")
            return f"Union[{', '.join(self.annotation(a) for a in args)}]"
        if origin in (list, dict):
            return f"{origin.__name__}[{', '.join(self.annotation(a) for a in args)}]"
        if origin is typing.Literal:
            self.typing.add("Literal")
            return f"Literal[{', '.join(_spelled(a) for a in args)}]"
        if tp is Any:
            self.typing.add("Any")
            return "Any"
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp.__name__
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            self.vocabulary.add(tp.__name__)
            return tp.__name__
        if tp in (str, int, bool, float):
            return tp.__name__
        raise TypeError(f"validation.py declares a field of type {tp!r}, which the objects' writer cannot spell")

    def default(self, info: Any) -> str:
        if info.default_factory is not None:
            self.needs_field = True
            factory = info.default_factory
            return f"field(default_factory={factory.__name__})"
        value = info.default
        if isinstance(value, enum.Enum):
            self.vocabulary.add(type(value).__name__)
            return f"{type(value).__name__}.{value.name}"
        if value is None or isinstance(value, (bool, int, str, float)):
            return _spelled(value)
        raise TypeError(f"validation.py gives a default {value!r}, which the objects' writer cannot spell")

    def struct(self, model: type[BaseModel]) -> str:
        hints = typing.get_type_hints(model, include_extras=True)
        mixins = [b.__name__ for b in model.__bases__ if b.__module__.endswith(".readings")]
        self.readings.update(mixins)
        self.vocabulary.add("Declared")
        doc = (model.__doc__ or "").strip().splitlines()
        lines = [f"class {model.__name__}({', '.join(mixins + ['Declared'])}, frozen=True, kw_only=True):"]
        if doc:
            lines += [f'    """{doc[0]}"""', ""]
        for name, info in model.model_fields.items():
            spelled = f"    {name}: {self.annotation(hints[name])}"
            lines.append(spelled if info.is_required() else f"{spelled} = {self.default(info)}")
        return "\n".join(lines)


def source_of(name: str) -> str:
    """The source of the generated file `name` (a key of FILES), as `vllm-patchkit schema` writes it."""
    doc, models = FILES[name]
    src = _Source()
    bodies = [src.struct(m) for m in models]
    imports = ["from __future__ import annotations", ""]
    if src.typing:
        imports.append(f"from typing import {', '.join(sorted(src.typing))}")
        imports.append("")
    if src.needs_field:
        imports += ["from msgspec import field", ""]
    if src.readings:
        imports.append(f"from vllm_patchkit.declaration.readings import {', '.join(sorted(src.readings))}")
    imports.append(f"from vllm_patchkit.declaration.vocabulary import {', '.join(sorted(src.vocabulary))}")
    exported = sorted(m.__name__ for m in models)
    return (f'{_HEADER}"""{doc}\n"""\n\n' + "\n".join(imports) + "\n\n\n" + "\n\n\n".join(bodies)
            + f"\n\n\n__all__ = {exported!r}\n".replace("'", '"'))


def stale_files(folder: Path = DECLARATION) -> list[Path]:
    """The generated files whose committed text is not what the models give now."""
    return [folder / n for n in FILES if not (folder / n).is_file() or (folder / n).read_text() != source_of(n)]


def write_objects(folder: Path = DECLARATION) -> list[Path]:
    paths = []
    for name in FILES:
        path = folder / name
        path.write_text(source_of(name))
        paths.append(path)
    return paths
