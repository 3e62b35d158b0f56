"""A placed site as the loader will accept it: what the draft must say beyond the place the plugin patched.

Facts only the release can tell, added to the site for the draft (`draft.py`): a module-level function the plugin
patches where another module holds it by value is declared at its definition with the holders that keep the
original in `copies` (all of them at once, not one per `pin` run), unless the object there is a class (a class
swapped for the plugin's object is a `set` of that one place, `classify.py`); a member of a class the plugin reaches through a
module that imports the class (a package's re-export) is declared at the class's defining module, with no `copies`
(the class object is one: its attribute is reached through it, never held by value); a name the plugin adds to a
vLLM class that does not have it is `adds: true` (pinned as absent), never a place that "is gone".
"""

from __future__ import annotations

import ast
from typing import Any

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.scan.model import Site
from vllm_patchkit.tools.static import Definition

#: sites that install a function at a module-level name (a by-value holder of it misses the patch)
FUNCTION_SITES = frozenset({"wrap", "replace", "functools_wraps", "wrapt"})


def at_release(up: Any, site: Site) -> None:
    """The facts of a site placed at a `module:Qualname` of the release."""
    class_object(up, site)
    held_by_value(up, site)
    class_home(up, site)


def class_object(up: Any, site: Site) -> None:
    """`facts["class_object"]`: the place holds a class of the release (`U.Encoder = factory`, `M.Layer =
    make_layer(M.Layer)`): a class is not a function, whatever the plugin puts in its place."""
    d = up.resolve(site.target) if site.target and ":" in site.target else None
    if isinstance(d, Definition) and isinstance(d.node, ast.ClassDef):
        site.facts["class_object"] = True


def held_by_value(up: Any, site: Site) -> None:
    """`copies` for a function site whose place holds the function by value (`site.defined_at` is elsewhere)."""
    if site.facts.get("class_object") or not site.defined_at or ":" not in (site.target or ":.") or Target.parse(site.target).is_member or site.mechanism not in FUNCTION_SITES or up.release is None:
        return
    from vllm_patchkit.tools.static_copies import demanded_holders

    held = demanded_holders(up.release, site.defined_at)
    site.hints["copies"] = sorted({site.target, *held} - {site.defined_at})


def class_home(up: Any, site: Site) -> None:
    """`facts["class_home"]`: `module:Class.member` at the module defining the class, when the site names the member
    through another module that holds the class (`vllm.config:VllmConfig.compute_hash` ->
    `vllm.config.vllm:VllmConfig.compute_hash`); the member may be the class's own or inherited."""
    try:
        place = Target.parse(site.target) if site.target and ":" in site.target else None
    except ValueError:
        return
    owner = place.owner_target if place is not None else None
    cls = up.resolve(str(owner)) if owner is not None else None
    if (isinstance(cls, Definition) and isinstance(cls.node, ast.ClassDef) and cls.where != str(owner)
            and "<" not in cls.qualname):
        site.facts["class_home"] = f"{cls.where}.{place.attr}"


def missing(up: Any, site: Site) -> None:
    """What the release lacks at the site's place (`facts["missing"]`, shown in the notes), and whether that is a
    name the plugin adds."""
    from vllm_patchkit.upstream.missing import Missing

    d = up.resolve(site.target) if site.target else None
    if isinstance(d, Missing) and not d.inherited_from and not d.unreadable:
        site.facts["missing"] = d.reason + (f"; now at {', '.join(d.moved_to)}" if d.moved_to else "")
        added_name(up, site, d)


def added_name(up: Any, site: Site, missing: Any) -> None:
    """`adds` for `module:Class.name` the release's class does not define nor inherit (not moved elsewhere)."""
    try:
        owner = Target.parse(site.target).owner_target
    except ValueError:  # a place the scan could not name as module:Qualname: nothing to add
        return
    if owner is not None and not missing.moved_to and isinstance(up.resolve(str(owner)), Definition):
        site.hints["adds"] = True


def registry_entry(up, site) -> None:
    """A key the plugin sets on one of vLLM's mappings: whether the release registers it itself (`adds` when not),
    read as `pin` reads it (`upstream/entries.py`)."""
    f = site.facts
    if site.mechanism == "registry" and site.target and f.get("entry") is not None and up.release is not None:
        from vllm_patchkit.tools.releases import StaticView

        f["entry_present"] = StaticView(up.release).entry(site.target, f["entry"])
