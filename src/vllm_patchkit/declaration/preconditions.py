"""Preconditions: judge a patch's `when` against the facts of this process.

Facts come in two stages. At plugin load: vLLM version, platform, role, env.
At the config-ready point: what the VllmConfig says (architectures, which class
the registry serves them with, runner, prefix caching, speculative decoding,
cudagraph mode). A failing precondition is returned as a value with expected
and actual, so the record can say exactly why a patch was skipped.

A fact the framework cannot read on a release (vLLM removed the field it reads,
the registry cannot be asked) is None in the facts: *unknown*, never *unmet*. A
conjunction with a known false part is unmet (the patch is not needed, whatever
the unknown part says); otherwise an unknown part makes the answer `Unknown`,
which the loader refuses for a required patch and warns about for an optional
one — never a quiet "not needed".
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Optional, Union

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


class Unknown(NamedTuple):
    """A precondition whose fact this process cannot read on this release: neither met nor unmet."""

    field: str
    expected: Any

    def __str__(self) -> str:
        return f"{self.field}: expected {self.expected}, actual unknown (this release does not let the framework read it)"


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


#: the V1 GPU model runner's module: a release without it (vLLM >= 0.34) runs the V2 runner only
V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"


def _module_exists(name: str) -> Optional[bool]:
    """Whether vLLM ships module `name`, found without importing it (None: cannot tell)."""
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return None


def runner_of(vllm_config: Any) -> Optional[str]:
    """Which model runner this configuration selects: read from the release, or None (unknown).

    vLLM 0.31-0.33 choose per config (`VllmConfig.use_v2_model_runner`); 0.34 removed the V1 runner with the
    property, so there the release itself says "v2" — but only when its V1 module is really gone and the V2
    one is there: a release that lost the property for another reason is unknown, never assumed.
    """
    try:
        return "v2" if vllm_config.use_v2_model_runner else "v1"
    except AttributeError:
        pass
    except Exception:
        return None
    if _module_exists(V1_RUNNER_MODULE) is False and _module_exists(V2_RUNNER_MODULE) is True:
        return "v2"
    return None


def _served_by(arch: str) -> Optional[str]:
    try:
        return served_by_module(arch)
    except Exception:  # the registry cannot be asked on this release: unknown, never "served by vLLM"
        return None


def config_facts(vllm_config: Any) -> dict:
    """The configuration facts preconditions read, as plain data (also shown by `status`)."""
    mc = getattr(vllm_config, "model_config", None)
    archs = getattr(mc, "architectures", None) if mc is not None else None
    archs = None if archs is None and mc is None else list(archs or [])
    cache = getattr(vllm_config, "cache_config", None)
    comp = getattr(vllm_config, "compilation_config", None)
    mode = getattr(comp, "cudagraph_mode", None)
    prefix = getattr(cache, "enable_prefix_caching", None)
    return {
        "architectures": archs,  # None: no model config to read (unknown); [] a config that names none
        "served_by": {a: _served_by(a) for a in archs or []},
        "runner": runner_of(vllm_config),
        "prefix_caching": prefix if isinstance(prefix, bool) else None,
        "speculative": (getattr(vllm_config, "speculative_config") is not None
                        if hasattr(vllm_config, "speculative_config") else None),
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


Judgement = Optional[Union[Unmet, Unknown]]


def unmet_at_import(when: When, facts: Facts) -> Judgement:
    """The first import-time precondition that does not hold (`Unmet`), else one that cannot be read (`Unknown`)."""
    if not version_matches(when, facts.vllm_version):
        return Unmet("vllm", when.vllm, facts.vllm_version)
    for name, want in (when.env or {}).items():
        got = facts.env.get(name)
        if got != want:
            return Unmet(f"env.{name}", "unset" if want is None else repr(want), "unset" if got is None else repr(got))
    if when.platform is not None:
        if facts.platform is None:
            return Unknown("platform", when.platform)
        if facts.platform not in when.platform:
            return Unmet("platform", when.platform, facts.platform)
    return None


def unmet_at_config(when: When, config: dict) -> Judgement:
    """The first config-time precondition that does not hold (`Unmet`); if none does not, the first whose fact is
    unknown (`Unknown`): a known false part decides the conjunction, an unknown part never does."""
    unknown: Optional[Unknown] = None
    archs = config.get("architectures")
    if when.architectures is not None:
        if archs is None:
            unknown = Unknown("architectures", when.architectures)
            matched: list = []
        else:
            matched = [a for a in archs if a in when.architectures]
            if not matched:
                return Unmet("architectures", when.architectures, archs)
    else:
        matched = list(archs or [])
    if when.served_by is not None and unknown is None:
        served = config.get("served_by") or {}
        if archs is None:
            unknown = Unknown("served_by", when.served_by)
        elif not any(served_ok(when.served_by, served.get(a)) for a in matched):
            if any(served.get(a) is None for a in matched):
                unknown = unknown or Unknown("served_by", when.served_by)
            else:
                return Unmet("served_by", when.served_by, {a: served.get(a) for a in matched})
    for name in ("runner", "prefix_caching", "speculative"):
        want = getattr(when, name)
        if want is None:
            continue
        got = config.get(name)
        if got is None:
            unknown = unknown or Unknown(name, want)
        elif got != want:
            return Unmet(name, want, got)
    if when.cudagraph_mode is not None:
        got = config.get("cudagraph_mode")
        if got is None:
            unknown = unknown or Unknown("cudagraph_mode", when.cudagraph_mode)
        elif got not in when.cudagraph_mode:
            return Unmet("cudagraph_mode", when.cudagraph_mode, got)
    return unknown


def model_matches(vllm_config: Any, architectures: list[str], served_by: Optional[str] = None) -> bool:
    """Whether the model of `vllm_config` is one of `architectures` (exact names) served as `served_by`, by the
    rule of a patch's `when`: for a set's code that judges a model without a patch context (an adapter)."""
    when = When(architectures=list(architectures), served_by=served_by)
    return unmet_at_config(when, config_facts(vllm_config)) is None
