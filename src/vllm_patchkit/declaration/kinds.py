"""The kinds' declarative part: what each kind's YAML needs and which optional fields it alone may take.

One row per kind. Its runtime part (how it is applied, what the loader asks of it) is the module of the same name
in `vllm_patchkit/runtime/kinds/`, found by that name: adding a kind is that module and one row here
(docs/writing-a-kind.md). The row lives in the declaration layer because reading a YAML file must not import the
runtime."""

from __future__ import annotations

from typing import NamedTuple



class KindDeclaration(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    name: str
    doc: str
    needs: tuple[str, ...] = ()  # fields a patch of this kind must give
    takes: tuple[str, ...] = ()  # optional fields only the kinds listing them may give


DECLARATIONS: tuple[KindDeclaration, ...] = (
    KindDeclaration("wrap", "implementation(wrapped, instance, args, kwargs[, ctx]) around the target, or a counted "
                    "passthrough", needs=("target",),
                    takes=("implementation", "copies", "params", "instances", "reimplements", "observer")),
    KindDeclaration("replace", "the target is replaced by the implementation", needs=("target", "implementation"),
                    takes=("copies", "reimplements")),
    KindDeclaration("set", "the target attribute is set to `value` (or what `value_from` names)", needs=("target",),
                    takes=("value", "value_from", "instances", "inherited_from")),
    KindDeclaration("env_default", "an env var gets a default when unset", needs=("env_default",)),
    KindDeclaration("refuse", "start-up stops with `message` when `when` holds", needs=("message",)),
    KindDeclaration("warn", "a warning with `message` when `when` holds; start-up goes on", needs=("message",)),
    KindDeclaration("subclass", "`implementation` (a subclass of the target class) is selected through "
                    "`config_field`", needs=("target", "implementation", "config_field", "overrides"),
                    takes=("reimplements",)),
)

#: The fields whose use depends on the kind: given to a kind that neither needs nor takes one, they are an error.
GOVERNED = frozenset(f for d in DECLARATIONS for f in d.needs + d.takes) - {"target"}

#: How a missing needed field is explained, where its name alone says too little.
HINTS = {
    "config_field": " (the VllmConfig field that selects the class, e.g. scheduler_config.scheduler_cls)",
    "overrides": " (a non-empty list of the target's methods the implementation overrides)",
    "env_default": " ({name, value})",
}


def declaration_of(kind: str) -> KindDeclaration:
    return next(d for d in DECLARATIONS if d.name == kind)


def _given(value: object) -> bool:
    """A field the YAML gave: not left at its empty default (None, False, an empty list)."""
    return value is not None and value is not False and value != []


def problems(kind: str, given: dict) -> list[str]:
    """What a patch of `kind` gives wrong, from the table: a needed field missing, a field for other kinds given."""
    decl = declaration_of(kind)
    out = [f"kind {kind!r} needs '{f}'{HINTS.get(f, '')}" for f in decl.needs if not _given(given.get(f))]
    for f in sorted(GOVERNED - set(decl.needs) - set(decl.takes)):
        if _given(given.get(f)):
            takers = [d.name for d in DECLARATIONS if f in d.needs or f in d.takes]
            out.append(f"'{f}' is only for kind{'s' if len(takers) > 1 else ''} {', '.join(takers)}, not {kind!r}")
    return out
