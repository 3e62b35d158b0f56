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
    # What it does at its target, as the layers that judge a patch ask it (verify, apply, check, status): never
    # which kind a patch is, so a new kind with the same traits needs no change there.
    #: how the function it installs at its places is called: "wrap": implementation(wrapped, instance, args,
    #: kwargs[, ctx]) around the original; "replace": in the original's place, with vLLM's calls as they are;
    #: "": it installs no function (the target's call convention, stale copies and call counters do not apply)
    call_shape: str = ""
    #: it sets the target attribute to a value (a value pin; on each object with `instances`)
    sets_value: bool = False
    #: it selects a class through a config field (judged at the config stage; its overrides are pinned)
    selects_class: bool = False
    #: its implementation is a subclass of the target class whose `overrides` vLLM calls: each overridden base
    #: method is pinned as `target.method` and the override judged against it (kinds subclass and hook)
    judges_overrides: bool = False
    #: it sets one entry (`entry`) of the mapping at the target (a run-time registry): pinned is whether vLLM
    #: registers that key itself, not the mapping's value
    sets_entry: bool = False

    @property
    def installs_function(self) -> bool:
        return self.call_shape != ""

    @property
    def wraps_original(self) -> bool:
        """Its implementation runs around the original, as impl(wrapped, instance, args, kwargs[, ctx]) (none: a
        counted passthrough): it gets a PatchContext, reads declared `params`, may wrap a property's getter."""
        return self.call_shape == "wrap"

    @property
    def stands_in(self) -> bool:
        """Its implementation stands in the original's place, called with vLLM's arguments as they are: it must
        take the target's signature, and vLLM's function is not called through it."""
        return self.call_shape == "replace"

    @property
    def pins_source(self) -> bool:
        """It re-implements the target's body: the target's source digest is pinned, not only its signature."""
        return self.stands_in


DECLARATIONS: tuple[KindDeclaration, ...] = (
    KindDeclaration("wrap", "implementation(wrapped, instance, args, kwargs[, ctx]) around the target, or a counted "
                    "passthrough", needs=("target",),
                    takes=("implementation", "copies", "params", "instances", "reimplements", "copied_part", "observer"),
                    call_shape="wrap"),
    KindDeclaration("replace", "the target is replaced by the implementation", needs=("target", "implementation"),
                    takes=("copies", "reimplements", "copied_part"), call_shape="replace"),
    KindDeclaration("set", "the target attribute is set to `value` (or what `value_from` names)", needs=("target",),
                    takes=("value", "value_from", "instances", "inherited_from", "adds"), sets_value=True),
    KindDeclaration("register", "the entry `entry` of the mapping at the target (a registry vLLM reads, such as "
                    "MODEL_ARCH_CONFIG_CONVERTORS) is set to `value` (or what `value_from` names)",
                    needs=("target", "entry"), takes=("value", "value_from", "adds"), sets_entry=True),
    KindDeclaration("env_default", "an env var gets a default when unset", needs=("env_default",)),
    KindDeclaration("refuse", "start-up stops with `message` when `when` holds", needs=("message",)),
    KindDeclaration("warn", "a warning with `message` when `when` holds; start-up goes on", needs=("message",)),
    KindDeclaration("subclass", "`implementation` (a subclass of the target class) is selected through "
                    "`config_field`", needs=("target", "implementation", "config_field", "overrides"),
                    takes=("reimplements", "copied_part"), selects_class=True, judges_overrides=True),
    KindDeclaration("hook", "`implementation`, a subclass of the target class that vLLM reaches another way (a "
                    "registry, an entry point, a dotted path it imports), whose `overrides` are the methods vLLM "
                    "calls on the plugin's objects: each judged against the base method's pin; nothing installed",
                    needs=("target", "implementation", "overrides"), takes=("reimplements", "copied_part"),
                    judges_overrides=True),
)
_BY_NAME = {d.name: d for d in DECLARATIONS}

#: The fields whose use depends on the kind: given to a kind that neither needs nor takes one, they are an error.
GOVERNED = frozenset(f for d in DECLARATIONS for f in d.needs + d.takes) - {"target"}

#: How a missing needed field is explained, where its name alone says too little.
HINTS = {
    "entry": " (the key of the mapping's entry the patch sets, e.g. glm5)",
    "config_field": " (the VllmConfig field that selects the class, e.g. scheduler_config.scheduler_cls)",
    "overrides": " (a non-empty list of the target's methods the implementation overrides)",
    "env_default": " ({name, value})",
}


def declaration_of(kind: object) -> KindDeclaration:
    """The row of a kind, by its name or its `Kind` member (a str enum: its value is the name)."""
    return _BY_NAME[getattr(kind, "value", kind)]


def installs_function(kind_name: object) -> bool:
    """Whether the kind named in a record (any JSON value: records are read defensively) installs a function:
    its calls are counted. An unknown name installs none."""
    row = _BY_NAME.get(kind_name) if isinstance(kind_name, str) else None
    return row is not None and row.installs_function


def traits(patch: object) -> KindDeclaration:
    """The row of a patch's kind: what the layers that judge the patch ask instead of which kind it is."""
    return declaration_of(patch.kind)


def _given(value: object) -> bool:
    """A field the YAML gave: not left at its empty default (None, False, an empty list or mapping)."""
    return value is not None and value is not False and value != [] and value != {}


def problems(kind: str, given: dict) -> list[str]:
    """What a patch of `kind` gives wrong, from the table: a needed field missing, a field for other kinds given."""
    decl = declaration_of(kind)
    out = [f"kind {kind!r} needs '{f}'{HINTS.get(f, '')}" for f in decl.needs if not _given(given.get(f))]
    for f in sorted(GOVERNED - set(decl.needs) - set(decl.takes)):
        if _given(given.get(f)):
            takers = [d.name for d in DECLARATIONS if f in d.needs or f in d.takes]
            out.append(f"'{f}' is only for kind{'s' if len(takers) > 1 else ''} {', '.join(takers)}, not {kind!r}")
    return out
