"""The `__wrapped__` layers above an upstream target, and whose code each one is.

Why: a target's wrappers are part of its pin (`Fingerprint.wrappers`), and a layer that is neither upstream's
nor ours is someone else's patch (a conflict). Names cannot tell (`functools.wraps` copies the wrapped
function's module and qualname), so a layer is judged by where its code is: upstream's package, its declared
dependencies and the standard library (`upstream_code_roots`, kept in the start-up cache per installation),
or anywhere else.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Optional


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
    from vllm_patchkit.upstream.cache_stamps import installation_stamp

    # packages_distributions() reads every installed distribution's RECORD (~150 ms): kept per installation
    digest = hashlib.sha256(json.dumps([top, installation_stamp()]).encode()).hexdigest()[:16]
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
