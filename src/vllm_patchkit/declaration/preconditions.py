"""Preconditions: judge a patch's `when` against the facts of this process.

Facts come in two stages. At plugin load: vLLM version, platform, role, env.
At the config-ready point: what the VllmConfig says (architectures, which class
the registry serves them with, runner, prefix caching, speculative decoding,
cudagraph mode). A failing precondition is returned as a value with expected
and actual, so the record can say exactly why a patch was skipped.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Optional

from msgspec import Struct, field
from packaging.version import Version

from vllm_patchkit.declaration.schema import When


class Unmet(NamedTuple):  # a NamedTuple: built at every start-up, ~10x cheaper than a frozen dataclass
    """One precondition that does not hold."""

    field: str
    expected: Any
    actual: Any

    def __str__(self) -> str:
        return f"{self.field}: expected {self.expected}, actual {self.actual}"


class Facts(Struct):
    vllm_version: str
    platform: Optional[str]
    role: str
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    config: Optional[dict] = None  # see config_facts()


def current_platform_name() -> Optional[str]:
    try:
        from vllm.platforms import current_platform
    except Exception:
        return None
    for name in ("cuda", "rocm", "cpu", "xpu", "tpu"):
        probe = getattr(current_platform, f"is_{name}", None)
        if probe is not None and probe():
            return name
    return None


def served_by_module(arch: str) -> Optional[str]:
    """Module of the class vLLM's registry serves `arch` with, without importing it."""
    from vllm.model_executor.models.registry import ModelRegistry

    entry = ModelRegistry.models.get(arch)
    if entry is None:
        return None
    module = getattr(entry, "module_name", None)
    if module is None:
        cls = getattr(entry, "model_cls", None)
        module = getattr(cls, "__module__", None)
    return module


def runner_of(vllm_config: Any) -> Optional[str]:
    try:
        return "v2" if vllm_config.use_v2_model_runner else "v1"
    except Exception:
        return None


def config_facts(vllm_config: Any) -> dict:
    """The configuration facts preconditions read, as plain data (also shown by `status`)."""
    mc = getattr(vllm_config, "model_config", None)
    archs = list(getattr(mc, "architectures", None) or []) if mc is not None else []
    cache = getattr(vllm_config, "cache_config", None)
    comp = getattr(vllm_config, "compilation_config", None)
    mode = getattr(comp, "cudagraph_mode", None)
    return {
        "architectures": archs,
        "served_by": {a: served_by_module(a) for a in archs},
        "runner": runner_of(vllm_config),
        "prefix_caching": getattr(cache, "enable_prefix_caching", None),
        "speculative": getattr(vllm_config, "speculative_config", None) is not None,
        "cudagraph_mode": getattr(mode, "name", None if mode is None else str(mode)),
    }


def served_ok(want: str, module: Optional[str]) -> bool:
    if module is None:
        return False
    in_tree = module == "vllm" or module.startswith("vllm.")
    if want == "out_of_tree":
        return not in_tree
    if want == "vllm":
        return in_tree
    return module == want or module.startswith(want.rstrip(".") + ".")


#: (specifier, release) -> admitted; the start-up cache fills it for the installed release (`remember_admits`), so a
#: process served from the cache never compiles packaging's specifier grammar (~6 ms of CPU per process)
_ADMITS: dict[tuple[str, str], bool] = {}


def version_matches(when: When, vllm_version: str) -> bool:
    """Whether a patch version's `when.vllm` admits this release (no range: every release)."""
    if when.vllm is None:
        return True
    key = (when.vllm, vllm_version)
    if key not in _ADMITS:
        from packaging.specifiers import SpecifierSet

        _ADMITS[key] = Version(vllm_version) in SpecifierSet(when.vllm, prereleases=True)
    return _ADMITS[key]


def admits_for(specifiers, vllm_version: str) -> dict[str, bool]:
    """What each `when.vllm` specifier says of one release (written into the start-up cache)."""
    return {s: version_matches(When(vllm=s), vllm_version) for s in specifiers}


def remember_admits(admits: dict[str, bool], vllm_version: str) -> None:
    """Answers computed by an earlier process for this release (read from the start-up cache)."""
    for spec, ok in admits.items():
        if isinstance(spec, str) and isinstance(ok, bool):
            _ADMITS.setdefault((spec, vllm_version), ok)


def held(when: When, config: dict) -> str:
    """The declared config-time preconditions with the values that satisfied them (for messages)."""
    parts = []
    archs = [a for a in config.get("architectures") or [] if when.architectures is None or a in when.architectures]
    if when.architectures is not None:
        parts.append(f"architecture {', '.join(archs)}")
    if when.served_by is not None:
        served = config.get("served_by") or {}
        parts.append(f"served by {', '.join(str(served.get(a)) for a in archs)} ({when.served_by})")
    for name in ("runner", "prefix_caching", "speculative", "cudagraph_mode"):
        if getattr(when, name) is not None:
            parts.append(f"{name} {config.get(name)}")
    for name, want in (when.env or {}).items():
        parts.append(f"{name}={want}")
    return "; ".join(parts) or "it has no preconditions"


def unmet_at_import(when: When, facts: Facts) -> Optional[Unmet]:
    if not version_matches(when, facts.vllm_version):
        return Unmet("vllm", when.vllm, facts.vllm_version)
    if when.platform is not None and facts.platform not in when.platform:
        return Unmet("platform", when.platform, facts.platform)
    for name, want in (when.env or {}).items():
        got = facts.env.get(name)
        if got != want:
            return Unmet(f"env.{name}", "unset" if want is None else repr(want), "unset" if got is None else repr(got))
    return None


def unmet_at_config(when: When, config: dict) -> Optional[Unmet]:
    archs = config.get("architectures") or []
    if when.architectures is not None:
        matched = [a for a in archs if a in when.architectures]
        if not matched:
            return Unmet("architectures", when.architectures, archs)
    else:
        matched = archs
    if when.served_by is not None:
        served = config.get("served_by") or {}
        if not any(served_ok(when.served_by, served.get(a)) for a in matched):
            return Unmet("served_by", when.served_by, {a: served.get(a) for a in matched})
    for name in ("runner", "prefix_caching", "speculative"):
        want = getattr(when, name)
        if want is not None and config.get(name) != want:
            return Unmet(name, want, config.get(name))
    if when.cudagraph_mode is not None and config.get("cudagraph_mode") not in when.cudagraph_mode:
        return Unmet("cudagraph_mode", when.cudagraph_mode, config.get("cudagraph_mode"))
    return None
