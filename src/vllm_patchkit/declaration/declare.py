"""Declare: read patch files and manifests into validated objects, or say exactly what is wrong.

Everything is validated before anything touches vLLM, so a bad file can never
leave a half-applied state.
"""

from __future__ import annotations

import graphlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable

import yaml
from pydantic import ValidationError

from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.pins import Manifest


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<file>"


def _rule_field(model: type, msg: str) -> str | None:
    """The field a document-level rule is about, read from its message.

    Rules spanning several fields ("kind 'wrap' needs 'target'") are checked on the
    whole document, so pydantic reports them at the root; name the field the message
    quotes (or, failing that, mentions) instead of the document.
    """
    fields = getattr(model, "model_fields", {})
    for name in re.findall(r"'([A-Za-z_]+)", msg):
        if name in fields:
            return name
    for word in re.findall(r"[A-Za-z_]+", msg):
        for name in (word, word + "s"):
            if name in fields:
                return name
    return None


def _validation_errors(file: str, exc: ValidationError, model: type | None = None) -> list[DeclarationError]:
    errs = []
    for e in exc.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "value_error" and msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema; typo?)"
        elif not loc and e["type"] == "value_error":
            loc = (_rule_field(model, msg) or "<file>",)  # the input is the whole document: don't echo it
        elif "input" in e and e["type"] not in ("missing",):
            msg = f"{msg} (got {e['input']!r:.80})"
        errs.append(DeclarationError(file, _field_path(loc), msg))
    return errs


def _node_path(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _duplicate_keys(node: yaml.Node, path: str, seen: set[int]) -> list[tuple[str, int, int]]:
    """(field path, first line, second line) of every key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word, which turns a pasted
    or mistyped line into a silent change of meaning. YAML merge keys (`<<`) are
    left alone: overriding a merged key is what they are for.
    """
    if id(node) in seen:  # an alias seen before (possibly a cycle)
        return []
    seen.add(id(node))
    found = []
    if isinstance(node, yaml.MappingNode):
        first: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            here = _node_path(path, key)
            if key is not None:
                line = key_node.start_mark.line + 1
                if (key_node.tag, key) in first:
                    found.append((here, first[(key_node.tag, key)], line))
                else:
                    first[(key_node.tag, key)] = line
            found += _duplicate_keys(value_node, here, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _duplicate_keys(item, f"{path}[{i}]", seen)
    return found


def _read_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(str(path), "<file>", f"cannot read: {exc}") from None
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # checks the characters first: inside the try
        node = loader.get_single_node()
        if node is None:
            return None
        duplicates = _duplicate_keys(node, "", set())
        if duplicates:
            errors = [DeclarationError(str(path), where, f"duplicate key (line {a} and line {b}); "
                                       "YAML would keep only the last one silently")
                      for where, a, b in duplicates]
            raise errors[0] if len(errors) == 1 else PatchSetErrors(errors)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f"line {mark.line + 1}"
        elif isinstance(getattr(exc, "position", None), int):  # ReaderError: a character YAML forbids
            where = f"line {text.count(chr(10), 0, exc.position) + 1}"
        else:
            where = "<file>"
        raise DeclarationError(str(path), where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except RecursionError:
        raise DeclarationError(str(path), "<file>", "not readable: values nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_patch(path: Path) -> Patch:
    """One patch file -> Patch, or DeclarationError/PatchSetErrors naming file and field."""
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise DeclarationError(str(path), "<file>", f"expected a mapping of patch fields, got {type(data).__name__}")
    try:
        return Patch.model_validate(data)
    except ValidationError as exc:
        raise PatchSetErrors(_validation_errors(str(path), exc, Patch)) from None
    except RecursionError:
        raise DeclarationError(str(path), "<file>", "not readable: values nested too deeply") from None


def parse_manifest(path: Path) -> Manifest:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise DeclarationError(str(path), "<file>", f"expected a manifest mapping, got {type(data).__name__}")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise PatchSetErrors(_validation_errors(str(path), exc, Manifest)) from None
    except RecursionError:
        raise DeclarationError(str(path), "<file>", "not readable: values nested too deeply") from None


@dataclass
class PatchSet:
    """All patch versions, by key id@version, with the file each came from."""

    patches: dict[str, Patch] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    set_of: dict[str, str] = field(default_factory=dict)  # key -> name of the patch set it came from

    def by_id(self, patch_id: str) -> list[Patch]:
        return [p for p in self.patches.values() if p.id == patch_id]

    def requires_of(self, patch: Patch) -> list[str]:
        """`requires` plus what its stage implies: a config-stage patch depends on the config-ready
        point of each of its processes (the hooks marked `config_ready: true`)."""
        out = list(patch.requires)
        if patch.stage == "config":
            for hook in self.patches.values():
                if hook.config_ready and set(hook.processes) & set(patch.processes) and hook.id not in out:
                    out.append(hook.id)
        return out


def _collect(errors: list, fn, *args):
    try:
        return fn(*args)
    except PatchSetErrors as exc:
        errors.extend(exc.errors)
    except DeclarationError as exc:
        errors.append(exc)
    return None


def _declared_id(path: Path) -> dict[str, str]:
    """{id: file} for a file that failed to load but still names its id (for better follow-on errors)."""
    try:
        data = _read_yaml(path)
    except (DeclarationError, PatchSetErrors):
        return {}
    pid = data.get("id") if isinstance(data, dict) else None
    return {pid: str(path)} if isinstance(pid, str) else {}


def load_patch_set(dirs: Iterable) -> PatchSet:
    """Read every *.yaml under the given folders (or patch-set sources); check ids and `requires` across files."""
    errors: list[DeclarationError] = []
    ps = PatchSet()
    broken: dict[str, str] = {}  # id -> file, of files that failed to load but say their id
    # id -> (set name, file) of its first declaration: an id belongs to one set. Two sets declaring one id used to
    # become two versions of one patch (one of them never applied and had no row).
    owner: dict[str, tuple[str, str, str]] = {}
    for d in dirs:
        set_name = getattr(d, "name", None) if not isinstance(d, (str, Path)) else None
        d = getattr(d, "patches", d)
        for path in sorted(Path(d).glob("*.yaml")):
            patch = _collect(errors, parse_patch, path)
            if patch is None:
                broken.update(_declared_id(path))
                continue
            first = owner.get(patch.id)
            if set_name is not None and first is not None and first[0] != set_name:
                errors.append(DeclarationError(
                    str(path), "id",
                    f"patch id {patch.id!r} is declared by two patch sets: {set_name!r} ({path}, {patch.key}) and "
                    f"{first[0]!r} ({first[1]}, {first[2]}); a patch id must be unique across sets (rename one of them)"))
                continue
            if patch.key in ps.patches:
                errors.append(
                    DeclarationError(str(path), "id", f"duplicate patch {patch.key} (also in {ps.files[patch.key]})")
                )
                continue
            if set_name is not None:
                owner.setdefault(patch.id, (set_name, str(path), patch.key))
            ps.patches[patch.key] = patch
            ps.files[patch.key] = str(path)
            if set_name is not None:
                ps.set_of[patch.key] = set_name
    ids = {p.id for p in ps.patches.values()}
    for key, p in ps.patches.items():
        for i, dep in enumerate(p.requires):
            if dep in broken:
                errors.append(DeclarationError(ps.files[key], f"requires[{i}]",
                                               f"patch {dep!r} is declared in {broken[dep]}, which failed to load (see its error)"))
            elif dep not in ids:
                errors.append(DeclarationError(ps.files[key], f"requires[{i}]", f"unknown patch id {dep!r}"))
    graph = {p.id: set(p.requires) & ids for p in ps.patches.values()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        cycle = exc.args[1]
        first = next(k for k, p in ps.patches.items() if p.id == cycle[0])
        errors.append(DeclarationError(ps.files[first], "requires", f"cycle: {' -> '.join(cycle)}"))
    if errors:
        raise PatchSetErrors(errors)
    return ps


def builtin_patch_dirs() -> list:
    """Every installed patch set (the framework's own first), as sources `load_patch_set` reads."""
    from vllm_patchkit.declaration.patchsets import discover

    return discover(with_env=False)


def manifest_dirs(sources: Iterable) -> list[Path]:
    """The manifests folders of the given sources, the framework's first (it is the main one)."""
    return [s.manifests for s in sources if getattr(s, "manifests", None) is not None]


def builtin_manifest_dir() -> Path:
    return Path(str(resources.files("vllm_patchkit.manifests")))
