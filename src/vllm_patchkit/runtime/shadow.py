"""Shadowed targets: a patch on a base-class method that the class in use overrides without reaching it.

Such a patch installs cleanly and can never run (vLLM's CPU runner overrides
`GPUModelRunner._to_list`, for one). Once a process knows the classes it will
really use, each class-level target is checked against them: if a subclass in
use defines the method again and its body never calls up (`super().name` or
`Base.name`), the patch is reported shadowed at start-up.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.targets import TargetError, resolve

# Which model runner a worker class constructs, by runner version (vLLM 0.31's
# cpu_worker.py / gpu_worker.py `init_device`). Judged from the config, as vLLM will select it.
RUNNERS = {
    "vllm.v1.worker.cpu_worker:CPUWorker": {
        "v1": "vllm.v1.worker.cpu_model_runner:CPUModelRunner",
        "v2": "vllm.v1.worker.cpu.model_runner:CPUModelRunner",
    },
    "vllm.v1.worker.gpu_worker:Worker": {
        "v1": "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
        "v2": "vllm.v1.worker.gpu.model_runner:GPUModelRunner",
    },
}


def _dotted_to_spec(dotted: str) -> str:
    module, _, name = dotted.rpartition(".")
    return f"{module}:{name}"


def classes_in_use(vllm_config: Any, role: str, runner: Optional[str]) -> dict[str, str]:
    """role-relevant classes vLLM will use in this process: {'worker': spec, 'model_runner': spec, 'scheduler': spec}."""
    out: dict[str, str] = {}
    if role == "worker":
        worker = getattr(getattr(vllm_config, "parallel_config", None), "worker_cls", None)
        if isinstance(worker, str) and "." in worker:
            out["worker"] = _dotted_to_spec(worker)
            by_version = RUNNERS.get(out["worker"])
            if by_version and runner in by_version:
                out["model_runner"] = by_version[runner]
    if role == "engine_core":
        try:
            cls = vllm_config.scheduler_config.get_scheduler_cls()
            out["scheduler"] = f"{cls.__module__}:{cls.__qualname__}"
        except Exception:
            pass
    return out


def _calls_up(func: Any, name: str, base_names: set[str]) -> bool:
    """Whether the override's body reaches `name` on a base: super().name / Base.name / super(X, self).name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(func))))
    except (OSError, TypeError, SyntaxError):
        return True  # cannot tell: do not claim shadowing
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == name:
            v = node.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super":
                return True
            if isinstance(v, ast.Name) and v.id in base_names:
                return True
    return False


def shadowing(target_owner: type, name: str, used: type) -> Optional[str]:
    """The class that shadows `target_owner.name` for instances of `used`, or None."""
    if used is target_owner or not issubclass(used, target_owner):
        return None
    for klass in used.__mro__:
        if klass is target_owner:
            return None
        if name in klass.__dict__:
            func = klass.__dict__[name]
            func = getattr(func, "__func__", func)
            bases = {c.__name__ for c in klass.__mro__[1:]}
            if not _calls_up(func, name, bases):
                return f"{klass.__module__}:{klass.__qualname__}"
            return None
    return None


def find_shadowed(target: str, in_use: dict[str, str]) -> list[tuple[str, str]]:
    """[(class in use, shadowing class)] for a `module:Class.method` target."""
    place = Target.parse(target)
    if not place.is_member:
        return []
    owner_spec, method = str(place.owner_target), place.attr
    try:
        owner = resolve(owner_spec).get_raw()
    except TargetError:
        return []
    if not isinstance(owner, type):
        return []
    hits = []
    for spec in in_use.values():
        try:
            used = resolve(spec).get_raw()
        except TargetError:
            continue
        if isinstance(used, type):
            by = shadowing(owner, method, used)
            if by is not None:
                hits.append((spec, by))
    return hits
