"""What the patch schema can declare each site as: one of its kinds plus field hints, or why it cannot.

The vocabulary is the schema's (`vllm_patchkit.declaration.schema.Kind`): wrap, replace, set, env_default, refuse, subclass.
"""

from __future__ import annotations

from typing import Callable, Optional

from vllm_patchkit.tools.scan.model import Site

#: Bases vLLM builds from a config field, -> that field (the `subclass` kind's `config_field`).
SELECTED_BY_FIELD = {
    "Scheduler": "scheduler_config.scheduler_cls",
    "AsyncScheduler": "scheduler_config.scheduler_cls",
    "SchedulerInterface": "scheduler_config.scheduler_cls",
    "Worker": "parallel_config.worker_cls",
    "WorkerBase": "parallel_config.worker_cls",
    "CPUWorker": "parallel_config.worker_cls",
    "XPUWorker": "parallel_config.worker_cls",
}

#: `value_from` of a class swap whose object the scan cannot name (the loader refuses a placeholder by name).
CLASS_PLACEHOLDER = "TODO.module:PluginClass"

NOT_YET = "not yet declarable (docs/writing-a-patch.md, 'Not yet declarable')"


def classify(site: Site, selected: dict[str, str]) -> None:
    """Fill `declare`, `hints`, `reason` of one site. `selected`: plugin class -> config field that selects it."""
    if _computed_at_run_time(site):
        return
    step = _BY_MECHANISM.get(site.mechanism)
    if step is not None and step(site, site.facts, selected) is _REFUSED:
        return
    if site.facts.get("missing"):
        site.notes.append(f"not in this release: {site.facts['missing']}")


#: What a mechanism's step returns when its reason says all there is (no note on what the release lacks follows).
_REFUSED = True


def _computed_at_run_time(site: Site) -> bool:
    m, f = site.mechanism, site.facts
    if m in ("wrap", "instance_attr") and f.get("unresolved") and not site.target:
        site.reason = (f"the object patched ({f['unresolved']}) is computed at run time: declare `kind: wrap`"
                       + (" + `instances: true`" if m == "instance_attr" else "")
                       + f" on each vLLM class whose {f.get('attr')!r} it reaches")
        return True
    return False


def _class_in_place(site: Site, f: dict) -> bool:
    """A class's place set to a plugin object (a factory function, a subclass built from the original): no `wrap`
    or `replace` (they install a function; the loader refuses one at a class), a `set` of the place, as a class
    swap: `value_from` the plugin's importable object, else a placeholder the reviewer fills (the note says why)."""
    if not f.get("class_object") or f.get("instance"):
        return False
    site.declare = "set"
    built = site.mechanism != "replace" or f.get("calls_original")  # made from the original class at run time
    site.hints["value_from"] = f.get("impl_spec") if f.get("impl_spec") and not built else CLASS_PLACEHOLDER
    if built:
        site.notes.append(f"a class: what the plugin sets there ({site.what}) is made at run time from the "
                          "original; value_from names a module-level class or function that does the same")
    elif not f.get("impl_spec"):
        site.notes.append("a class: the plugin sets an object defined inside a function; value_from names a "
                          "module-level one")
    return True


def _wrapped(site: Site, f: dict, selected: dict[str, str]) -> None:
    if _class_in_place(site, f):
        return
    site.declare = "wrap"
    if f.get("instance"):
        site.hints["instances"] = True
    if f.get("calls_original") is False:
        site.notes.append("the wrapper never calls the original")


def _replaced(site: Site, f: dict, selected: dict[str, str]) -> None:
    if _class_in_place(site, f):
        return
    if f.get("instance"):
        site.declare = "wrap"
        site.hints["instances"] = True
        site.notes.append("set on objects: a replace on each instance is a wrap (instances: true) that does not "
                          "call `wrapped`")
    else:
        site.declare = "replace"


def _method_on_an_object(site: Site, f: dict, selected: dict[str, str]) -> None:
    if site.target:
        site.declare = "wrap"
        site.hints["instances"] = True
    else:
        site.reason = (f"a method set on an object whose class cannot be read statically: declare `kind: wrap` + "
                       f"`instances: true` on the vLLM class that defines {f.get('attr')!r}")


def _class_swapped(site: Site, f: dict, selected: dict[str, str]) -> None:
    site.declare = "set"
    impl = f.get("impl_spec")
    site.hints["value_from"] = impl or CLASS_PLACEHOLDER


def _attribute_set(site: Site, f: dict, selected: dict[str, str]) -> Optional[bool]:
    if f.get("dynamic"):
        site.reason = "setattr with a name computed at run time: the attribute cannot be read statically"
        return _REFUSED
    if f.get("missing") and f.get("value_kind") != "literal":
        site.reason = ("adds an attribute this release does not have (the plugin's own bookkeeping, e.g. the "
                       "saved original): nothing of vLLM changes there")
        return _REFUSED
    if f.get("instance"):
        site.reason = ("an attribute of a vLLM object set at run time (a field of the run's config, of a metadata "
                       "or manager object): the schema sets module and class attributes, not the run's objects")
        return _REFUSED
    site.declare = "set"
    if f.get("value_kind") == "literal":
        site.hints["value"] = f.get("value")
    elif f.get("value_kind") == "vllm":
        site.hints["value_from"] = f.get("value_spec")
    else:
        site.hints["value_from"] = "TODO.module:object_the_plugin_sets"
    return None


def _env_set(site: Site, f: dict, selected: dict[str, str]) -> None:
    if f.get("value") is None:
        site.declare = "env_default"
        site.hints["env_default"] = {"name": f["env"], "value": "TODO"}
        site.notes.append("value computed at run time")
    else:
        site.declare = "env_default"
        site.hints["env_default"] = {"name": f["env"], "value": f["value"]}
    if f.get("overwrites"):
        site.notes.append("the plugin overwrites the variable; env_default only sets it when unset")


def _module_swapped(site: Site, f: dict, selected: dict[str, str]) -> None:
    site.reason = ("a whole vLLM module replaced in sys.modules: no schema kind swaps a module; declare each "
                   "attribute the plugin's module changes as set/wrap, or keep the swap outside the patch set")


def _registered(site: Site, f: dict, selected: dict[str, str]) -> None:
    if f.get("entry") is None or not site.target:
        site.reason = f"a registration through a vLLM registry: {NOT_YET}"
        return
    site.declare = "register"  # a key set on one of vLLM's mappings
    site.hints["entry"] = f["entry"]
    site.hints["value_from"] = f.get("impl_spec") or "TODO.module:object_the_plugin_registers"
    present = f.get("entry_present")
    if present is False:
        site.hints["adds"] = True
    elif not isinstance(present, bool):
        site.notes.append(f"whether vLLM registers {f['entry']!r} itself was not read ({present or 'no release'}): "
                          "`adds: true` if it does not (pin reads it)")


def _config_field_set(site: Site, f: dict, selected: dict[str, str]) -> None:
    cls = f.get("cls")
    base = f.get("vllm_base")
    if base and f.get("plugin_class"):
        site.declare = "subclass"
        site.hints["config_field"] = f["config_field"]
        site.hints["implementation"] = f["plugin_class"]
    else:
        site.reason = (f"a field of the run's config overwritten ({f['config_field']} = {cls or '…'}): "
                       + ("the class it selects is not a subclass of a vLLM class read here; " if cls else "")
                       + NOT_YET)


def _overridden(site: Site, f: dict, selected: dict[str, str]) -> None:
    field = selected.get(f.get("cls", "")) or SELECTED_BY_FIELD.get((f.get("base_name") or "").split(".")[-1])
    site.notes.append("calls super()" if f.get("calls_super") else "does not call super()")
    if field:
        site.declare = "subclass"
        site.hints["config_field"] = field
        site.hints["overrides"] = [f.get("method")]
    else:
        site.reason = ("an override in a subclass vLLM does not build from a config field (a model, a "
                       "connector, a backend, a platform...): no kind states it; its base method can be pinned "
                       "through `uses:`/`reimplements:` of the patch that relies on it")


def _refused(site: Site, f: dict, selected: dict[str, str]) -> None:
    site.reason = ("the plugin stops vLLM here (raise " + str(f.get("exception")) + " in its override of "
                   + str(f.get("override")) + "): declare `kind: refuse` with `message:` and the plugin's "
                   "condition as `when:`, if `when` can state it")
    if f.get("message"):
        site.hints["message"] = f["message"]


def _body_copied(site: Site, f: dict, selected: dict[str, str]) -> None:
    site.reason = ("a copy of an upstream body: state it as `reimplements:` of the patch that installs the "
                   "copy" + (f" (here: {f.get('installed_by')})" if f.get("installed_by") else ""))
    site.hints["reimplements"] = [site.target]


def _unparsed(site: Site, f: dict, selected: dict[str, str]) -> None:
    site.reason = f.get("error", "does not parse")


#: How each mechanism is declared (model.MECHANISMS); one step each.
_BY_MECHANISM: dict[str, Callable[[Site, dict, dict[str, str]], Optional[bool]]] = {
    "wrap": _wrapped, "functools_wraps": _wrapped, "wrapt": _wrapped,
    "replace": _replaced,
    "instance_attr": _method_on_an_object,
    "class_swap": _class_swapped,
    "setattr": _attribute_set,
    "env": _env_set,
    "sys_modules": _module_swapped,
    "registry": _registered,
    "config_field": _config_field_set,
    "subclass_override": _overridden,
    "refuse": _refused,
    "copy_body": _body_copied,
    "parse_error": _unparsed,
}


def schema_has_reimplements() -> bool:
    from vllm_patchkit.declaration.schema import Patch

    return "reimplements" in Patch.__struct_fields__


def first(xs) -> Optional[str]:
    return xs[0] if xs else None


__all__ = ["SELECTED_BY_FIELD", "classify", "schema_has_reimplements"]
