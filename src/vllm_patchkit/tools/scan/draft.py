"""`scan --write DIR`: one draft patch YAML per declarable site, a stub implementation module per wrap/replace
draft, an empty manifests folder; every draft validated with the real schema before it is written.

Layout (a Python package, so implementations are importable once DIR is on `sys.path`):

    DIR/<pkg>_patchkit/__init__.py
    DIR/<pkg>_patchkit/<id>.yaml          the declaration (TODO text where the scan cannot know)
    DIR/<pkg>_patchkit/<id_module>.py     wrap: (wrapped, instance, args, kwargs) forwarding; replace: calls the plugin
    DIR/<pkg>_patchkit/manifests/         empty: `vllm-patchkit pin` writes vllm-X.yaml here
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.tools.scan.classify import schema_has_reimplements
from vllm_patchkit.tools.scan.model import ScanResult, Site, placed


@dataclass
class Draft:
    id: str
    doc: dict
    sites: list[Site]
    stub: Optional[str] = None        # module file name
    stub_text: Optional[str] = None
    comments: list[str] = field(default_factory=list)


def package_name(result: ScanResult) -> str:
    tops: dict[str, int] = {}
    for s in result.sites:
        top = s.file.split("/")[0] if "/" in s.file else s.file.removesuffix(".py")
        if top == "src" and s.file.count("/") > 1:
            top = s.file.split("/")[1]
        tops[top] = tops.get(top, 0) + 1
    top = max(tops, key=tops.get) if tops else "plugin"
    name = re.sub(r"\W", "_", top).strip("_").lower() or "plugin"
    if name[0].isdigit():
        name = f"p_{name}"
    return f"{name}_patchkit"


def _slug(text: str) -> str:
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", text)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", s)
    s = re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower()
    return s or "patch"


def _ident(text: str) -> str:
    s = re.sub(r"\W", "_", text).strip("_") or "impl"
    if s[0].isdigit() or keyword.iskeyword(s):
        s = f"_{s}"
    return s


def processes_for(target: Optional[str]) -> list[str]:
    """A guess a reviewer checks: which process imports and calls the target."""
    t = target or ""
    if any(k in t for k in ("vllm.v1.core", "vllm.v1.engine.core", "sched", "kv_cache_utils", "vllm.v1.kv_offload")):
        return ["engine_core"]
    if any(k in t for k in ("vllm.v1.worker", "model_executor", "attention", "vllm.v1.sample", "spec_decode",
                            "distributed", "vllm.v1.attention", "layers")):
        return ["worker"]
    if any(k in t for k in ("entrypoints", "engine.arg_utils", "async_llm", "llm_engine")):
        return ["frontend"]
    return ["frontend", "engine_core", "worker"]


def _plain(v: Any) -> Any:
    if isinstance(v, (tuple, list, set, frozenset)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


def _base_doc(pid: str, site: Site, kind: str, target: Optional[str]) -> dict:
    doc: dict[str, Any] = {
        "id": pid,
        "version": 1,
        "summary": f"{kind} {target or site.hints.get('env_default', {}).get('name', '')} "
                   f"(drafted by vllm-patchkit scan from {site.where})",
        "why": f"TODO: say what fails in vLLM without this patch (the plugin does this at {site.where}: {site.what})",
        "upstream": "TODO: the upstream issue or pull request, or 'none: reason'",
        "retire_when": {"manual": "TODO: when this patch can go (or {vllm: '>=X.Y'}, or {probe: module:function})"},
        "kind": kind,
    }
    if target:
        doc["target"] = target
    return doc


def _stub_wrap(func: str, site: Site) -> str:
    impl = site.facts.get("impl_spec")
    return (f'"""Drafted by `vllm-patchkit scan` from {site.where}: a forwarding wrap of {site.target}.\n\n'
            f"TODO: move the plugin's wrapper logic here{f' (it is {impl})' if impl else ''}; forward vLLM's call\n"
            f'verbatim (`wrapped(*args, **kwargs)`), read parameters with a ctx (5th parameter) and `params:`.\n"""\n\n\n'
            f"def {func}(wrapped, instance, args, kwargs):\n"
            f"    return wrapped(*args, **kwargs)\n")


def _stub_replace(func: str, site: Site) -> str:
    impl = site.facts.get("impl_spec")
    head = (f'"""Drafted by `vllm-patchkit scan` from {site.where}: the replacement of {site.target}.\n\n'
            f"Called exactly like the target: `{func}(*args, **kwargs)`.\n")
    if impl:
        mod, qual = Target.parse(impl)
        return (head + f'TODO: the draft calls the plugin\'s own function {impl}; move it here if it should live '
                       f'beside the YAML.\n"""\n\n\n'
                       f"def {func}(*args, **kwargs):\n"
                       f"    import importlib\n\n"
                       f"    obj = importlib.import_module({mod!r})\n"
                       f"    for name in {qual.split('.')!r}:\n"
                       f"        obj = getattr(obj, name)\n"
                       f"    return obj(*args, **kwargs)\n")
    return (head + f'TODO: the plugin installs a function the scan cannot import (a closure or a lambda at '
                   f'{site.where}); write it here.\n"""\n\n\n'
                   f"def {func}(*args, **kwargs):\n"
                   f"    raise NotImplementedError('TODO: the replacement drafted from {site.where}')\n")


def _last_name(place: Optional[str], default: str) -> str:
    """The qualname of a placed target; a name the scan could not place (a dotted path) as it is."""
    target = placed(place)
    return target.qualname if target is not None else (place or default)


def build(result: ScanResult, pkg: str) -> list[Draft]:
    drafts: list[Draft] = []
    used: set[str] = set()
    with_reimplements = schema_has_reimplements()

    def new_id(text: str) -> str:
        base = _slug(text)[:60].strip("-") or "patch"
        pid, n = base, 2
        while pid in used:
            pid, n = f"{base}-{n}", n + 1
        used.add(pid)
        return pid

    by_key: dict[tuple, Draft] = {}
    for site in result.sites:
        kind = site.declare
        if kind is None:
            continue
        target = (site.defined_at if (kind == "subclass" and site.mechanism == "subclass_override")
                  or site.hints.get("copies") else site.facts.get("class_home") or site.target)
        # a by-value holder: at the definition; a member of a class another module holds: at the class's module
        if kind == "subclass":
            cls = site.hints.get("implementation") or site.facts.get("cls")
            base = site.target.rsplit(".", 1)[0] if site.mechanism == "subclass_override" and site.target else site.target
            key = ("subclass", cls, base)
            d = by_key.get(key)
            if d is None:
                pid = new_id(f"{_last_name(cls, 'subclass')}-subclass")
                doc = _base_doc(pid, site, "subclass", base)
                doc["implementation"] = cls if cls and "<locals>" not in cls else "TODO.module:PluginSubclass"
                doc["config_field"] = site.hints.get("config_field")
                doc["overrides"] = []
                d = by_key[key] = Draft(pid, doc, [])
                drafts.append(d)
            d.sites.append(site)
            for m in site.hints.get("overrides", []):
                if m not in d.doc["overrides"]:
                    d.doc["overrides"].append(m)
            if site.hints.get("reimplements"):
                d.doc.setdefault("_reimplements", []).extend(site.hints["reimplements"])
            continue
        if kind == "env_default":
            env = site.hints["env_default"]
            key = ("env", env["name"])
        elif kind == "register":
            key = (kind, target, site.hints["entry"])  # one patch per entry of the mapping
        else:
            key = (kind, target, bool(site.hints.get("instances")))
        if key in by_key:
            by_key[key].sites.append(site)
            if site.hints.get("reimplements"):
                by_key[key].doc.setdefault("_reimplements", []).extend(site.hints["reimplements"])
            continue
        label = (env["name"] if kind == "env_default" else
                 str(site.hints["entry"]) if kind == "register" else
                 _last_name(target, "patch"))
        pid = new_id(f"{label}-{kind}" if kind != "env_default" else f"{label}-default")
        doc = _base_doc(pid, site, kind, target if kind != "env_default" else None)
        d = Draft(pid, doc, [site])
        if kind == "env_default":
            doc["env_default"] = {"name": env["name"], "value": str(env["value"])}
        elif kind == "set":
            if site.hints.get("adds"):
                doc["adds"] = True
            if "value" in site.hints and site.hints["value"] is not None:
                doc["value"] = _plain(site.hints["value"])
            elif site.hints.get("value_from"):
                doc["value_from"] = site.hints["value_from"]
        elif kind == "register":
            doc["entry"] = str(site.hints["entry"])
            doc["value_from"] = site.hints["value_from"]
            if site.hints.get("adds"):
                doc["adds"] = True
        elif kind in ("wrap", "replace"):
            func = _ident(_last_name(target, "impl").split(".")[-1])
            d.stub = f"{_ident(pid)}.py"
            d.stub_text = _stub_wrap(func, site) if kind == "wrap" else _stub_replace(func, site)
            doc["implementation"] = f"{pkg}.{_ident(pid)}:{func}"
            if site.hints.get("copies"):
                doc["copies"] = list(site.hints["copies"])
            if site.hints.get("instances"):
                doc["instances"] = True
            if site.hints.get("reimplements"):
                doc["_reimplements"] = list(site.hints["reimplements"])
        by_key[key] = d
        drafts.append(d)
    for d in drafts:
        d.doc["processes"] = (["frontend", "engine_core", "worker"] if d.doc["kind"] == "env_default"
                              else processes_for(d.doc.get("target")))
        d.doc["required"] = True  # a patch the plugin applies is needed: optional only by the author's word
        d.doc["draft"] = True  # refused by the loader, pin and check until a person deletes it (review.py)
        reimpl = list(dict.fromkeys(d.doc.pop("_reimplements", [])))
        if reimpl:
            scores = {k: v for s in d.sites for k, v in s.facts.get("reimplements_scores", {}).items()}
            d.comments += [f"reimplements {r}: the plugin's code is a copy of it (similarity {scores[r]:.2f}, "
                           "normalised AST): `check` reports each change to that body" for r in reimpl if r in scores]
            if with_reimplements:
                d.doc["reimplements"] = reimpl
            else:
                d.comments.append(f"reimplements: {reimpl}  # hint: the schema of this vllm-patchkit has no "
                                  f"`reimplements` field yet; the implementation copies these upstream bodies")
        for s in d.sites:
            d.comments.append(f"site: {s.mechanism} at {s.where}: {s.what}" + (f" ({'; '.join(s.notes)})" if s.notes else ""))
        d.comments.append("processes: a guess from the target's module (TODO: check where vLLM calls it); "
                          "required: true unless you decide the plugin works without it")
        d.comments.append("draft: true: the loader, `pin` and `check` refuse this file until you have reviewed it "
                          "and deleted that line")
    return drafts


def render_yaml(d: Draft, schema: Optional[str] = None) -> str:
    head = [f"# yaml-language-server: $schema={schema}"] if schema else []
    head += ["# Drafted by `vllm-patchkit scan --write`: review every TODO, then delete `draft: true`, before pinning."]
    head += [f"# {c}" for c in d.comments]
    return "\n".join(head) + "\n" + yaml.safe_dump(d.doc, sort_keys=False, width=120, allow_unicode=True)


def validate(text: str):
    """The draft as the framework reads it (the real schema), or the error."""
    from vllm_patchkit.declaration import schema, validation

    return validation.validate(schema.Patch, yaml.safe_load(text))


def write(result: ScanResult, out: Path) -> tuple[Path, list[Path], list[tuple[str, str]]]:
    """Write the drafts; returns (patch folder, files written, (draft id, validation error) of drafts not written)."""
    pkg = package_name(result)
    folder = Path(out) / pkg
    (folder / "manifests").mkdir(parents=True, exist_ok=True)
    init = folder / "__init__.py"
    if not init.exists():
        init.write_text(f'"""Patches of {result.plugin}, drafted by `vllm-patchkit scan`."""\n', encoding="utf-8")
    written, rejected = [init], []
    import os

    schema = os.path.relpath(Path(__file__).resolve().parents[2] / "json_schema" / "patch.schema.json", folder.resolve())
    for d in build(result, pkg):
        text = render_yaml(d, schema)
        try:
            validate(text)
        except Exception as exc:
            rejected.append((d.id, str(exc)))
            continue
        path = folder / f"{d.id}.yaml"
        path.write_text(text, encoding="utf-8")
        written.append(path)
        if d.stub:
            (folder / d.stub).write_text(d.stub_text, encoding="utf-8")
            written.append(folder / d.stub)
    return folder, written, rejected


__all__ = ["Draft", "build", "package_name", "processes_for", "render_yaml", "validate", "write"]
