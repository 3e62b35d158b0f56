"""Fingerprints: a normalised signature (and source digest) of an upstream target.

Signatures are rendered from the function's *source* with `ast`, so a live
fingerprint (from an imported vLLM) and a static one (from a wheel that is not
installed) come out of the same code and compare equal. Annotations are left
out (they are strings in one case and objects in the other); parameter names,
kinds, order and defaults are kept, which is what call conventions depend on.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import functools
import textwrap
import types
from typing import Any, Optional

from vllm_patchkit.declaration.schema import Fingerprint


def _default(node: ast.expr) -> str:
    try:
        return repr(ast.literal_eval(node))
    except Exception:
        return ast.unparse(node)


def render_arguments(args: ast.arguments) -> str:
    """`(a, b=None, /, c, *rest, d=1, **kw)` with no annotations."""
    out: list[str] = []
    positional = list(args.posonlyargs) + list(args.args)
    defaults: list[Optional[ast.expr]] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(positional, defaults)):
        out.append(a.arg if d is None else f"{a.arg}={_default(d)}")
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            out.append("/")
    if args.vararg is not None:
        out.append(f"*{args.vararg.arg}")
    elif args.kwonlyargs:
        out.append("*")
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append(a.arg if d is None else f"{a.arg}={_default(d)}")
    if args.kwarg is not None:
        out.append(f"**{args.kwarg.arg}")
    return "(" + ", ".join(out) + ")"


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


def source_digest(node: ast.AST) -> str:
    """Digest of a def's code, blind to comments, docstrings, decorators and formatting."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        node = type(node)(**{**node.__dict__, "body": _strip_docstring(node.body), "decorator_list": []})
    return "sha256:" + hashlib.sha256(ast.dump(node, annotate_fields=False).encode()).hexdigest()[:16]


def from_def(node: ast.AST, kind: str, with_digest: bool = False) -> Fingerprint:
    """Fingerprint of a parsed def (the static path and the live path both end here)."""
    sig = render_arguments(node.args) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    return Fingerprint(kind=kind, signature=sig, source_digest=source_digest(node) if with_digest else None)


def _parse_def(func: Any) -> Optional[ast.AST]:
    try:
        src = inspect.getsource(func)
    except (OSError, TypeError):
        return None
    # A method's source is indented. Parse it as the body of `if 1:` rather than
    # dedenting it: `textwrap.dedent` would also change the text of multi-line
    # strings inside the def (nested docstrings), and the source digest would
    # then differ from the one read statically from the module.
    indented = src[:1] in (" ", "\t")
    try:
        tree = ast.parse("if 1:\n" + src if indented else src)
        body = tree.body[0].body if indented else tree.body
    except SyntaxError:
        try:
            body = ast.parse(textwrap.dedent(src)).body
        except SyntaxError:
            return None
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return node
    return None


def _signature_without_source(func: Any) -> Optional[str]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                           return_annotation=inspect.Signature.empty))


def raw_kind(raw: Any, owner_is_class: bool) -> str:
    if isinstance(raw, staticmethod):
        return "staticmethod"
    if isinstance(raw, classmethod):
        return "classmethod"
    if isinstance(raw, type):
        return "class"
    if type(raw).__module__ == "typing" or type(raw).__name__ == "GenericAlias":
        return "attribute"  # a type alias (`X = Literal[...]`, `list[int]`): callable, but a value, as read statically
    if callable(raw):
        return "method" if owner_is_class else "function"
    return "attribute"


def innermost(raw: Any) -> Any:
    """The upstream function under staticmethod/classmethod and every `__wrapped__` layer."""
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    return inspect.unwrap(raw) if callable(raw) else raw


_SCALARS = {type(None): "N", bool: "b", int: "i", float: "f", str: "s", bytes: "y"}
_MAX_ITEMS = 10_000


def _canonical(value: Any, budget: list[int]) -> Optional[str]:
    """A type-tagged, order-independent text of a simple literal; None for anything else."""
    budget[0] -= 1
    if budget[0] < 0:
        return None
    t = type(value)  # exact types: a subclass (an enum member, a str subclass) is not a simple literal
    tag = _SCALARS.get(t)
    if tag is not None:
        if t is float:
            return f"f:{value.hex()}"
        if t is bytes:
            return f"y:{len(value)}:{value.hex()}"
        if t is str:
            return f"s:{len(value)}:{value}"
        return f"{tag}:{value!r}"
    if t in (tuple, frozenset, dict):
        items = value.items() if t is dict else value
        parts = []
        for item in items:
            if t is dict:
                k, v = _canonical(item[0], budget), _canonical(item[1], budget)
                part = None if k is None or v is None else f"{k}={v}"
            else:
                part = _canonical(item, budget)
            if part is None:
                return None
            parts.append(part)
        if t is not tuple:
            parts.sort()
        return {tuple: "t", frozenset: "F", dict: "d"}[t] + f"{len(parts)}(" + ",".join(parts) + ")"
    return None


def value_digest(value: Any) -> Optional[str]:
    """Digest of a simple literal (int, float, str, bytes, bool, None, and tuples, frozensets and
    dicts of those); None for any other value (it is not pinned)."""
    text = _canonical(value, [_MAX_ITEMS])
    if text is None:
        return None
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def literal_digest(node: Any) -> Optional[str]:
    """The value digest of an expression written as a literal (as `value_digest` of the value it evaluates to);
    None when the source does not spell a literal (a call, a name, an expression)."""
    if not isinstance(node, ast.expr):
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return value_digest(value)


# -- an attribute of each object (`kind: set` + `instances: true`) ------------------------------------
# One rule, two readers: `static.StaticRelease.instance_attribute` (check, pin: the release's source) and
# `live_instance_attribute` (the loader: the imported class's source) both end in `instance_attribute`.
INSTANCE_ATTRIBUTE = "instance_attribute"


def instance_attribute(chain: Any, attr: str, owner: str) -> "Fingerprint | tuple[str, bool]":
    """The pin of `owner.attr` as an attribute of each object: kind `instance_attribute`, and the value digest of
    what `__init__` assigns when that is one simple literal (`self.x = None`, `self.x: int = 0`).

    `chain`: the class and its bases in the release, in MRO order, as (where `module:Qualname`, its `ast.ClassDef`
    or None when its source cannot be read). The first class whose own methods assign `self.attr` decides. Returns
    (why not, unreadable) when no method assigns it."""
    from vllm_patchkit.upstream.static_tables import instance_assignments

    for where, node in chain:
        if node is None:
            return f"{owner}.{attr}: the source of {where} cannot be read, so what it assigns is unknown", True
        found = instance_assignments(node).get(attr)
        if not found:
            continue
        init = {literal_digest(v) for m, v in found if m == "__init__"}
        digest = init.pop() if len(init) == 1 else None
        return Fingerprint(kind=INSTANCE_ATTRIBUTE, value_digest=digest)
    top = owner.split(".")[0].partition(":")[0]
    return (f"no method of {owner} or of its bases in the {top} package assigns self.{attr} (read from their "
            f"source): {owner.rpartition(':')[2]} objects do not get that attribute from {top}'s code"), False


def live_instance_attribute(cls: type, attr: str) -> "Fingerprint | tuple[str, bool]":
    """`instance_attribute` of an imported class: its MRO, the classes of its own top-level package only (the
    static reader cannot follow a base outside the release either), each read from its source."""
    top = cls.__module__.split(".")[0]
    chain = ((f"{k.__module__}:{k.__qualname__}", _parse_def(k)) for k in cls.__mro__
             if k.__module__.split(".")[0] == top)
    return instance_attribute(chain, attr, f"{cls.__module__}:{cls.__qualname__}")


def live(raw: Any, owner_is_class: bool, with_digest: bool = False, with_value: bool = False) -> Fingerprint:
    """Fingerprint of an object as it is installed now (our own wrappers looked through).

    `with_value`: a non-callable attribute holding a simple literal also gets its `value_digest`
    (opt-in, like `with_digest`: the static reader does not compute it, and a live and a static
    fingerprint of the same release must compare equal)."""
    kind = raw_kind(raw, owner_is_class)
    if kind == "attribute":
        return Fingerprint(kind=kind, value_digest=value_digest(raw) if with_value else None)
    func = innermost(raw)
    key = _cache_key(func, kind, with_digest)
    if key is not None:
        hit = _cached_fingerprints().get(key)
        if hit is not None:
            return Fingerprint(kind=kind, signature=hit[0], source_digest=hit[1])
    node = _parse_def(func)
    if node is not None:
        fp = from_def(node, kind, with_digest)
        if key is not None:
            _remember(key, fp)
        return fp
    return Fingerprint(kind=kind, signature=None if kind == "class" else _signature_without_source(func))


# -- the live-fingerprint cache (cache.py) ----------------------------------------------------------
# Parsing a target's source costs 1-20 ms (a class, or a function in a big module); the result depends only
# on the file's text, so it is kept per (file, size, mtime_ns, inode, qualname, line, kind, digest or not). The
# file as a whole carries the digest of its content (cache.py): an entry edited in place (a pinned signature
# put where the live one differs) fails it, and every fingerprint is then computed from the source again.
_FP_CACHE_NAME = "fingerprints.json"
_fp_cache: Optional[dict] = None


def _cache_key(func: Any, kind: str, with_digest: bool) -> Optional[str]:
    import os
    import sys

    if type(func) is types.FunctionType:
        file, line = func.__code__.co_filename, func.__code__.co_firstlineno
    elif isinstance(func, type):
        file, line = getattr(sys.modules.get(func.__module__), "__file__", None), 0
    else:
        return None
    if not file or not os.path.isabs(file):
        return None
    try:
        st = os.stat(file)
    except OSError:
        return None
    return (f"{file}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{func.__module__}:{func.__qualname__}|{line}|{kind}"
            f"|{int(with_digest)}")


def _entries(body: Any) -> Optional[dict]:
    entries = body.get("entries") if isinstance(body, dict) else None
    if not isinstance(entries, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(x is None or isinstance(x, str) for x in v)
            for v in entries.values()):
        return None
    return entries


def _cached_fingerprints() -> dict:
    global _fp_cache
    if _fp_cache is None:
        from vllm_patchkit.upstream import cache

        body = cache.read(_FP_CACHE_NAME)  # a tampered or foreign file: None, said in the record, recomputed
        entries = _entries(body) if body is not None else {}
        if entries is None:
            cache.rebuilt(_FP_CACHE_NAME, "its entries are not [signature, digest] pairs", cache.TAMPERED)
            entries = {}
        _fp_cache = entries
    return _fp_cache


def _remember(key: str, fp: Fingerprint) -> None:
    """Add one entry and rewrite the file (temp + replace): a concurrent writer may drop it, never corrupt it."""
    from vllm_patchkit.upstream import cache

    entries = _cached_fingerprints()
    entries[key] = [fp.signature, fp.source_digest]
    on_disk = _entries(cache.read_entry(_FP_CACHE_NAME)[0])  # keep what other processes added meanwhile
    if on_disk:
        on_disk.update(entries)
        entries = on_disk
    if len(entries) > 4096:  # stale keys of older releases: start over rather than grow without bound
        entries = {key: [fp.signature, fp.source_digest]}
    cache.write(_FP_CACHE_NAME, {"entries": entries})


def wrapper_layers(raw: Any, ours: set[int] = frozenset()) -> list[str]:
    """Names of the `__wrapped__` layers above the upstream function, ours excluded."""
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    layers = []
    seen = set()
    obj = raw
    while hasattr(obj, "__wrapped__") and id(obj) not in seen:
        seen.add(id(obj))
        if id(obj) not in ours and not getattr(obj, "__vllm_patchkit__", None):
            if inspect.isfunction(obj):
                layers.append(f"{obj.__module__}.{obj.__qualname__}")
            else:
                layers.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
        obj = obj.__wrapped__
    return layers


@functools.lru_cache(maxsize=None)
def upstream_code_roots(top: str) -> tuple[str, ...]:
    """Folders whose code counts as upstream's own: the package, its declared dependencies, the stdlib.

    vLLM decorates its methods with its own decorators (`@instrument`) and with its
    dependencies' (`@torch.inference_mode()`, whose wrapper code lives in torch). A
    plugin's wrapper lives in neither.
    """
    import hashlib
    import importlib.machinery
    import importlib.metadata as md
    import json
    import os
    import re
    import sysconfig

    from vllm_patchkit.upstream import cache

    # packages_distributions() reads every installed distribution's RECORD (~150 ms): kept per installation
    digest = hashlib.sha256(json.dumps([top, cache.installation_stamp()]).encode()).hexdigest()[:16]
    cache_name = f"roots-{top}-{digest}.json"
    hit = cache.read(cache_name)  # verified against its digest; keyed by the installation
    if (isinstance(hit, dict) and hit.get("key") == digest and isinstance(hit.get("roots"), list)
            and all(isinstance(r, str) for r in hit["roots"])):
        return tuple(hit["roots"])
    names = {top}
    try:
        mapping = md.packages_distributions()  # ~150 ms: computed once, only when a layer needs it
        dists = mapping.get(top, [])
        by_dist: dict[str, list[str]] = {}
        for mod, ds in mapping.items():
            for d in ds:
                by_dist.setdefault(d.lower().replace("_", "-"), []).append(mod)
        for dist in dists:
            for req in md.requires(dist) or []:
                name = re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
                names.update(by_dist.get(name, []))
    except Exception:
        pass
    roots = {os.path.abspath(sysconfig.get_paths()["stdlib"])}
    for name in names:
        try:
            spec = importlib.machinery.PathFinder.find_spec(name)  # the file system only: imports nothing
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        for loc in spec.submodule_search_locations or []:
            roots.add(os.path.abspath(loc))
        if spec.origin and not spec.submodule_search_locations:
            roots.add(os.path.abspath(spec.origin))
    cache.write(cache_name, {"key": digest, "roots": sorted(roots)})
    return tuple(sorted(roots))


UPSTREAM, DEPENDENCY, FOREIGN = "upstream", "dependency", "foreign"


def classify_layers(raw: Any, upstream_module: str) -> list[tuple[str, str, str]]:
    """Every `__wrapped__` layer above the upstream function but ours, outermost first, as
    (name, where, label): `name` as `wrapper_layers` (and the pin) spells it; `where` is
    UPSTREAM (code inside the upstream package), DEPENDENCY (in its declared dependencies or
    the standard library) or FOREIGN (anywhere else); `label` says where the code is.

    Names cannot tell (`functools.wraps` copies the wrapped function's module and
    qualname), so a layer is judged by where its code is: a function layer by its
    code object's file, a proxy object (wrapt) by its type's module.
    """
    import os
    import sys

    top = upstream_module.split(".")[0]

    def inside(path: str, roots) -> bool:
        return any(path == r or path.startswith(r + os.sep) for r in roots)

    def where_is(path: Optional[str]) -> str:
        if path is None:
            return FOREIGN
        path = os.path.abspath(path)
        own = [os.path.abspath(p) for p in getattr(sys.modules.get(top), "__path__", [])]
        # cheap first: upstream's own package; its dependencies' folders only when needed
        if inside(path, own):
            return UPSTREAM
        return DEPENDENCY if inside(path, upstream_code_roots(top)) else FOREIGN

    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    out, seen, obj = [], set(), raw
    while hasattr(obj, "__wrapped__") and id(obj) not in seen:
        seen.add(id(obj))
        if not getattr(obj, "__vllm_patchkit__", None):
            name = (f"{obj.__module__}.{obj.__qualname__}" if inspect.isfunction(obj)
                    else f"{type(obj).__module__}.{type(obj).__qualname__}")
            if type(obj) is types.FunctionType:  # not isinstance: a wrapt proxy claims the wrapped class
                file = obj.__code__.co_filename
                out.append((name, where_is(file), f"{obj.__module__}.{obj.__qualname__} (code in {file})"))
            else:
                mod = sys.modules.get(type(obj).__module__)
                out.append((name, where_is(getattr(mod, "__file__", None)),
                            f"{type(obj).__module__}.{type(obj).__qualname__}"))
        obj = obj.__wrapped__
    return out


def foreign_layers(raw: Any, upstream_module: str) -> list[str]:
    """`__wrapped__` layers whose code is neither upstream's, its dependencies', nor ours:
    someone else's wrapper (see `classify_layers`)."""
    return [label for _, where, label in classify_layers(raw, upstream_module) if where == FOREIGN]


def unpinned_layers(raw: Any, upstream_module: str, pinned: list[str]) -> list[str]:
    """Layers with code in a dependency (torch, the stdlib, ...) that the pin does not account for.

    A plugin wrapping a target with `torch.no_grad()` adds a layer whose code is torch's:
    it was not there when the target was pinned, so it is someone else's. Each pinned
    layer name accounts for one live layer of that name (innermost first). Layers whose
    code is inside the upstream package are never counted here: upstream's own decorators
    may come and go with optional dependencies (vLLM's `@instrument` is a layer only when
    OpenTelemetry imports), in either direction between pin and run.
    """
    from collections import Counter

    budget = Counter(pinned)
    extra = []
    for name, where, label in reversed(classify_layers(raw, upstream_module)):
        if where != DEPENDENCY:
            continue
        if budget[name] > 0:
            budget[name] -= 1
        else:
            extra.append(label)
    return list(reversed(extra))
