"""A changed return shape judged per patch (`return_shape_changed`): does this patch depend on the shape?

One rule for `check`, `pin` and the loader (`compat.judge` calls it; the loader judges through `pinned.compare`),
reading the implementation from its source (`impl_static`, never imported) and how it uses the result
(`result_use`):

- a `replace` stands in the target's place: vLLM's callers now take the new shape from it: breaking;
- a `wrap` without implementation (a verbatim passthrough) hands vLLM's result back untouched: compatible;
- a `wrap` with an implementation: breaking when it unpacks, spreads or indexes beyond the new shape what
  `wrapped(...)` returns, or returns a tuple literal of its own of another length (vLLM's callers unpack it);
  compatible when it returns the result as it is or uses it whole. Reading element k by index (`result[0]`) is
  compatible when the new tuple still has it: only the arity is pinned, not what each element means (the reason
  says so);
- a subclass's override: as a wrap, on `super().name(...)`; an override that does not call it re-implements the
  method: breaking;
- a `uses:` entry: every call of it in the implementation's module (`ctx.use("name")(...)`, `name(...)`,
  `x.name(...)`), judged as the wrap's `wrapped(...)`;
- `refuse` and `env_default` never call the target nor see what it returns: compatible; a `set` stands in with
  its value: breaking.

An implementation that cannot be read is breaking (nothing can be judged), as for a signature change.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.names import Target
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.upstream import result_use as ru
from vllm_patchkit.upstream.findings import Breakage
from vllm_patchkit.upstream.impl_def import FUNC
from vllm_patchkit.upstream.return_shape import arity, own_nodes


def shown(file: str, module: str) -> str:
    """The implementation's file relative to the folder above its top package (`patches/x.py`), as reach shows it."""
    path = Path(file)
    up = len(module.split(".")) - (0 if path.name == "__init__.py" else 1)
    try:
        return path.relative_to(path.parents[up]).as_posix()
    except (IndexError, ValueError):
        return path.as_posix()


def _own_tuples(fn: ast.AST, new: Optional[int]) -> list[int]:
    """Lines where the function returns a tuple literal it builds itself, of another length than `new`."""
    return [n.lineno for n in own_nodes(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
            and (new is None or len(n.value.elts) != new)]


def _verdict(uses: list, own: list[int], new: Optional[int], who: str, what: str, where: str) -> tuple[bool, str]:
    now = f"a tuple of {new}" if new is not None else "a value whose shape is not read"
    bad = next((u for u in uses if u.breaks(new)), None)
    if bad is not None:
        return True, f"{who} {bad.words()} ({where}:{bad.line}), and {what} now returns {now}"
    if own:
        return True, (f"{who} returns a tuple it builds itself ({where}:{own[0]}) in the target's place, where vLLM's "
                      f"callers now take {now}")
    if not uses:
        return False, f"{who} does not use what {what} returns"
    said = " and ".join(dict.fromkeys(u.words() for u in uses))
    lines = ", ".join(dict.fromkeys(str(u.line) for u in uses))
    if any(u.how == ru.INDEXED for u in uses):
        return False, (f"{who} {said} ({where}:{lines}), which {now} still has (only the arity is pinned: that "
                       "the element keeps its meaning is taken, not read)")
    return False, f"{who} {said} ({where}:{lines}): its shape is not the patch's concern"


def judge(patch: Patch, b: Breakage, override: Optional[str]) -> tuple[bool, str]:
    """(breaking, why) of a `return_shape_changed` for this patch. `override`: the subclass's overridden method
    the breakage concerns (compat._override_name)."""
    from vllm_patchkit.upstream import impl_static

    new = arity(b.new)
    t = traits(patch)
    try:
        if b.target in patch.uses and b.target != patch.target:
            return _used(patch, Target.parse(b.target).attr, new, impl_static)
        if t.stands_in:
            d = impl_static.read(patch.implementation) if patch.implementation else None
            at = f" ({shown(d.file, Target.parse(d.spec).module)}:{d.line})" if d is not None else ""
            return True, (f"a replace stands in the target's place{at}: vLLM's callers now take "
                          f"{'a tuple of ' + str(new) if new is not None else 'a value whose shape is not read'} "
                          "from it")
        if t.selects_class and override is not None:
            return _override(patch, override, new, impl_static)
        if t.wraps_original:
            if patch.implementation is None:
                return False, "verbatim passthrough: vLLM's result reaches its caller untouched"
            return _wrap(patch, new, impl_static)
    except impl_static.ImplUnreadable as exc:
        return True, f"the implementation cannot be read to judge the change ({exc})"
    if not t.installs_function and not t.sets_value and not t.selects_class:
        return False, f"a {patch.kind.value} patch never calls the target nor sees what it returns"
    return True, f"a {patch.kind.value} patch stands in the target's place: a person re-reads the change"


def _wrap(patch: Patch, new: Optional[int], impl_static) -> tuple[bool, str]:
    d = impl_static.read(patch.implementation)
    params = [*d.node.args.posonlyargs, *d.node.args.args] if isinstance(d.node, FUNC) else []
    if not params:
        return True, f"the implementation {d.spec} has no parameter for the wrapped function: nothing can be judged"
    wrapped = params[0].arg
    where = shown(d.file, Target.parse(d.spec).module)
    return _verdict(ru.uses_in(d.node, ru.calls_of_name(wrapped)), _own_tuples(d.node, new), new,
                    f"the implementation {d.spec}", f"{wrapped}(...)", where)


def _override(patch: Patch, name: str, new: Optional[int], impl_static) -> tuple[bool, str]:
    d = impl_static.override(patch.implementation, name)
    if d is None or not isinstance(d.node, FUNC):
        return True, f"{patch.implementation} does not define {name!r} as a function: nothing can be judged"
    where = shown(d.file, Target.parse(d.spec).module)
    if not d.calls_super(name):
        return True, (f"the override {d.spec} ({where}:{d.line}) re-implements {name} without super(): it returns "
                      "its own value where vLLM's callers now take the new shape")
    return _verdict(ru.uses_in(d.node, ru.calls_of_super(name)), _own_tuples(d.node, new), new,
                    f"the override {d.spec}", f"super().{name}(...)", where)


def _used(patch: Patch, name: str, new: Optional[int], impl_static) -> tuple[bool, str]:
    if patch.implementation is None:
        return True, "a `uses:` entry without an implementation: nothing can be judged"
    module = Target.parse(patch.implementation).module
    file, tree = impl_static.module_tree(module)
    uses = [u for fn in ru.functions(tree) for u in ru.uses_in(fn, ru.calls_of_used(fn, name))]
    return _verdict(sorted(uses, key=lambda u: u.line), [], new, f"the implementation's module {module}",
                    f"{name}(...)", shown(str(file), module))


__all__ = ["judge", "shown"]
