"""Live fingerprints: the signature, return shape (and source digest) of an upstream target as it is imported now.

Why: the loader compares what vLLM holds in this process with the pin. The def is found from the live object
(our own wrappers and staticmethod/classmethod looked through) and its source parsed, then rendered by the
same code as the static reader's (`source_fingerprint`), so a live and a static fingerprint of one release
compare equal. Parsing a target's source costs 1-20 ms, so the results are kept in the start-up cache
(`fingerprints.json`), keyed by the file's stat.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import Any, Optional

import msgspec

from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.source_fingerprint import from_def, instance_attribute, value_digest


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

def live_instance_attribute(cls: type, attr: str) -> "Fingerprint | tuple[str, bool]":
    """`instance_attribute` of an imported class: its MRO, the classes of its own top-level package only (the
    static reader cannot follow a base outside the release either), each read from its source."""
    top = cls.__module__.split(".")[0]
    chain = ((f"{k.__module__}:{k.__qualname__}", _parse_def(k)) for k in cls.__mro__
             if k.__module__.split(".")[0] == top)
    return instance_attribute(chain, attr, f"{cls.__module__}:{cls.__qualname__}")


def _built(**values: Any) -> Fingerprint:
    """A Fingerprint of values computed here or read back from the live cache: each value checked for its type
    (msgspec's conversion; a wrong one is the ValueError the cache's reader treats as a damaged entry)."""
    return msgspec.convert(values, Fingerprint)


def live(raw: Any, owner_is_class: bool, with_digest: bool = False, with_value: bool = False) -> Fingerprint:
    """Fingerprint of an object as it is installed now (our own wrappers looked through).

    `with_value`: a non-callable attribute holding a simple literal also gets its `value_digest`
    (opt-in, like `with_digest`: the static reader does not compute it, and a live and a static
    fingerprint of the same release must compare equal)."""
    kind = raw_kind(raw, owner_is_class)
    if kind == "attribute":
        return _built(kind=kind, value_digest=value_digest(raw) if with_value else None)
    func = innermost(raw)
    key = _cache_key(func, kind, with_digest)
    if key is not None:
        hit = _cached_fingerprints().get(key)
        if hit is not None:
            return _built(kind=kind, signature=hit[0], source_digest=hit[1], return_shape=hit[2])
    node = _parse_def(func)
    if node is not None:
        fp = from_def(node, kind, with_digest)
        if key is not None:
            _remember(key, fp)
        return fp
    return _built(kind=kind, signature=None if kind == "class" else _signature_without_source(func))


# -- the live-fingerprint cache (cache.py) ----------------------------------------------------------
# Parsing a target's source costs 1-20 ms (a class, or a function in a big module); the result depends only
# on the file's text, so it is kept, as [signature, source digest, return shape], per (file, size, mtime_ns,
# inode, qualname, line, kind, digest or not). The file as a whole carries the digest of its content (cache.py):
# an entry edited in place (a pinned signature put where the live one differs) fails it, and every fingerprint
# is then computed from the source again.
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
            isinstance(v, list) and len(v) == 3 and all(x is None or isinstance(x, str) for x in v)
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
            cache.rebuilt(_FP_CACHE_NAME, "its entries are not [signature, digest, return shape] triples",
                          cache.TAMPERED)
            entries = {}
        _fp_cache = entries
    return _fp_cache


def _remember(key: str, fp: Fingerprint) -> None:
    """Add one entry and rewrite the file (temp + replace): a concurrent writer may drop it, never corrupt it."""
    from vllm_patchkit.upstream import cache

    entries = _cached_fingerprints()
    entries[key] = _entry(fp)
    on_disk = _entries(cache.read_entry(_FP_CACHE_NAME)[0])  # keep what other processes added meanwhile
    if on_disk:
        on_disk.update(entries)
        entries = on_disk
    if len(entries) > 4096:  # stale keys of older releases: start over rather than grow without bound
        entries = {key: _entry(fp)}
    cache.write(_FP_CACHE_NAME, {"entries": entries})


def _entry(fp: Fingerprint) -> list:
    return [fp.signature, fp.source_digest, fp.return_shape]
