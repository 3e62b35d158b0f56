"""How a `set` names a member of a class that is not its own plain attribute: one a subclass only inherits
(`inherited_from`), or one the plugin adds (`adds`). The field combinations each allows, checked for `Patch`
(validation.py) with the words a patch author reads."""

from __future__ import annotations

from vllm_patchkit.declaration.kinds import declaration_of
from vllm_patchkit.declaration.names import Target


def check_adds(patch) -> None:
    """`adds`: kind set of a class member, alone (an added name is neither each object's nor inherited); kind
    register: an entry vLLM does not register itself."""
    row = declaration_of(patch.kind)
    if row.sets_entry:
        return
    if not row.sets_value:
        raise ValueError(f"'adds: true' is only for kind set (a name the plugin adds to a vLLM class) or register "
                         f"(a key the plugin adds to a vLLM registry), not {patch.kind.value!r}")
    if patch.instances or patch.inherited_from is not None:
        raise ValueError("'adds: true' names a member vLLM does not have: not with 'instances' or 'inherited_from'")
    if not Target.parse(patch.target).is_member:
        raise ValueError(f"'adds: true' needs 'target' to name a member of a class (module:Class.name), not "
                         f"{patch.target!r}")


def check_inherited_from(patch) -> None:
    """`inherited_from`: kind set, no `instances`, the same attribute name on another class."""
    if not declaration_of(patch.kind).sets_value:
        raise ValueError(f"'inherited_from' is only for kind set (an inherited class attribute overridden on one "
                         f"subclass), not {patch.kind.value!r}")
    if patch.instances:
        raise ValueError("give 'instances: true' (an attribute of each object) or 'inherited_from' (a class "
                         "attribute overridden on one subclass), not both")
    sub, base = Target.parse(patch.target), Target.parse(patch.inherited_from)
    if not sub.is_member:
        raise ValueError(f"'inherited_from' needs 'target' to name a class attribute (module:Sub.attr), not "
                         f"{patch.target!r}")
    if not base.is_member or base.attr != sub.attr:
        raise ValueError(f"'inherited_from' must name the same attribute on a base class "
                         f"(module:Base.{sub.attr}), not {patch.inherited_from!r}")
    if patch.inherited_from == patch.target:
        raise ValueError("'inherited_from' names the target itself: give the base class that defines the attribute")
