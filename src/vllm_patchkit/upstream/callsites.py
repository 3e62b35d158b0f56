"""How vLLM really constructs a class it selects through a config field: its call sites, found statically.

A subclass's `__init__` is called by vLLM only where vLLM builds the selected class. For the scheduler that is
`vllm/v1/engine/core.py`: `Scheduler = vllm_config.scheduler_config.get_scheduler_cls()` and then
`Scheduler(vllm_config=..., kv_cache_config=..., ...)`, keyword arguments only. Judged against the base's
signature alone, an override `__init__(self, vllm_config, kv_cache_config, ...)` of `AsyncScheduler`
(whose `__init__` is `(self, *args, **kwargs)`) "has no *args where the target has *args" — but no call
vLLM makes passes a positional argument, so that is a false alarm. Here the calls are found in the release's
source and the override is judged against each (`accepts`).

A call site is a call of a name bound, in the same function, to the config field's resolver
(`x.get_scheduler_cls()`, `subclass.SELECTORS`) or to the field itself (`x.scheduler_cls`), or a direct call
of either (`x.get_scheduler_cls()(...)`). Files are filtered by text before they are parsed; the result is
cached per release (its source's label and version) for the life of the process.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Optional

from vllm_patchkit.upstream.static_source import Source

FUNC = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Call:
    """One construction vLLM makes: where, and the shape of its arguments."""

    file: str
    line: int
    positional: int
    keywords: tuple[str, ...]
    star: bool = False  # *args passed: the positional count is unknown
    dstar: bool = False  # **kwargs passed: the keywords are unknown

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def text(self) -> str:
        parts = ["<positional>"] * self.positional + (["*..."] if self.star else [])
        parts += [f"{k}=..." for k in self.keywords] + (["**..."] if self.dstar else [])
        return f"({', '.join(parts)})"

    @property
    def judgeable(self) -> bool:
        return not (self.star or self.dstar)


_CACHE: dict[tuple, tuple[Call, ...]] = {}


def _names(field: str, selector: Optional[str]) -> tuple[str, Optional[str]]:
    """The field's attribute name and the resolver method's name (`scheduler_cls`, `get_scheduler_cls`)."""
    return field.rpartition(".")[2], (selector.rpartition(".")[2] if selector else None)


def _is_source(node: ast.AST, attr: str, method: Optional[str]) -> bool:
    """`x.<attr>` or `x.<method>()`: an expression giving the selected class."""
    if isinstance(node, ast.Attribute) and node.attr == attr:
        return True
    return (method is not None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method)


def _calls_in(func: ast.AST, rel: str, attr: str, method: Optional[str]) -> list[Call]:
    bound: set[str] = set()
    for node in ast.walk(func):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _is_source(node.value, attr, method):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
    out = []
    for node in ast.walk(func):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if not ((isinstance(f, ast.Name) and f.id in bound) or _is_source(f, attr, method)):
            continue
        out.append(Call(rel, node.lineno,
                        positional=sum(1 for a in node.args if not isinstance(a, ast.Starred)),
                        keywords=tuple(k.arg for k in node.keywords if k.arg is not None),
                        star=any(isinstance(a, ast.Starred) for a in node.args),
                        dstar=any(k.arg is None for k in node.keywords)))
    return out


def constructions(source: Source, field: str, selector: Optional[str] = None, *, package: str = "vllm",
                  version: Optional[str] = None) -> tuple[Call, ...]:
    """Every call in the release's `package` that constructs the class the config `field` selects."""
    key = (getattr(source, "label", id(source)), version, package, field, selector)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    attr, method = _names(field, selector)
    needles = [n.encode() for n in (attr, method) if n]
    found: list[Call] = []
    for rel in source.python_files(package):
        raw = source.read(rel)
        if raw is None or not any(n in raw for n in needles):
            continue
        try:
            tree = ast.parse(raw)
        except (SyntaxError, ValueError):
            continue
        funcs = [n for n in ast.walk(tree) if isinstance(n, FUNC)]
        for func in funcs:
            # each function's own calls (a nested def is walked as its own function too: avoid counting twice)
            for call in _calls_in(func, rel, attr, method):
                if call not in found:
                    found.append(call)
    _CACHE[key] = tuple(found)
    return _CACHE[key]


def installed(field: str, selector: Optional[str] = None) -> tuple[Call, ...]:
    """`constructions` in the installed vLLM (what the loader runs inside), read from its files."""
    from vllm_patchkit.upstream.installed import installed_root, installed_version
    from vllm_patchkit.upstream.static_source import DirSource

    root = installed_root()
    if root is None:
        return ()
    return constructions(DirSource(root), field, selector, version=installed_version())


def accepts(sig: inspect.Signature, call: Call, *, bound_first: bool = True) -> Optional[str]:
    """None when `sig` (an `__init__`, with `self` when `bound_first`) takes the call; else the TypeError a
    call of that shape raises. A call with `*args`/`**kwargs` cannot be judged: the caller falls back."""
    args = [object()] * (call.positional + (1 if bound_first else 0))
    try:
        sig.bind(*args, **{k: None for k in call.keywords})
    except TypeError as exc:
        return str(exc)
    return None


def clear_cache() -> None:
    _CACHE.clear()


__all__ = ["Call", "accepts", "constructions", "installed"]
