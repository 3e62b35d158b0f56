"""The preconditions a patch's `when` may name: one row each, as declaration/kinds.py has one row per kind.

A row says everything about one precondition in one place: the field's type and text (the validating model
`validation.When` is built from the rows, and the objects every process reads are generated from that model), the
stage it is judged at, how its fact is read from a VllmConfig (config stage), how a wanted value is judged
against the fact, and how a held one is worded in a record. Adding a precondition is adding a row.

A fact the framework cannot read on a release is None: the judge answers `Unknown`, never `Unmet`.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple, Optional, Union


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


Judgement = Optional[Union[Unmet, Unknown]]


class Precondition(NamedTuple):
    """One precondition: its field, when it is judged, and how."""

    name: str
    stage: Literal["import", "config"]
    #: the field's type as the validating model declares it, constraints included: a string pydantic resolves in
    #: validation.py's namespace (this table is read in every process; pydantic's Field is not imported here)
    annotation: str
    description: Optional[str]
    #: config stage: (want, the config facts, the `when`) -> a judgement; import stage: (want, Facts) -> one
    judge: Callable[..., Judgement]
    #: config stage: (want, the config facts, the `when`) -> the words a record says of it when it held
    held: Optional[Callable[[Any, dict, Any], str]] = None
    #: config stage: (VllmConfig, the facts read before it) -> the fact, None when this release does not let it be read
    read: Optional[Callable[[Any, dict], Any]] = None


# -- reading the facts from a VllmConfig ----------------------------------------------------------
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


def _model_config(vllm_config: Any, facts: dict) -> Any:
    return getattr(vllm_config, "model_config", None)


def _read_architectures(vllm_config: Any, facts: dict) -> Optional[list]:
    """None: no model config to read (unknown); [] a config that names none."""
    mc = _model_config(vllm_config, facts)
    archs = getattr(mc, "architectures", None) if mc is not None else None
    return None if archs is None and mc is None else list(archs or [])


def _read_served_by(vllm_config: Any, facts: dict) -> dict:
    return {a: _served_by(a) for a in facts["architectures"] or []}


def _read_prefix_caching(vllm_config: Any, facts: dict) -> Optional[bool]:
    prefix = getattr(getattr(vllm_config, "cache_config", None), "enable_prefix_caching", None)
    return prefix if isinstance(prefix, bool) else None


def _read_speculative(vllm_config: Any, facts: dict) -> Optional[bool]:
    if not hasattr(vllm_config, "speculative_config"):
        return None
    return getattr(vllm_config, "speculative_config") is not None


def _read_cudagraph_mode(vllm_config: Any, facts: dict) -> Optional[str]:
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    return getattr(mode, "name", None if mode is None else str(mode))


# -- the judges ----------------------------------------------------------------------------------
def matched_architectures(when: Any, config: dict) -> list:
    """The served architectures the `when` names (all of them when it names none)."""
    archs = config.get("architectures") or []
    return [a for a in archs if when.architectures is None or a in when.architectures]


def served_ok(want: str, module: Optional[str]) -> bool:
    if module is None:
        return False
    in_tree = module == "vllm" or module.startswith("vllm.")
    if want == "out_of_tree":
        return not in_tree
    if want == "vllm":
        return in_tree
    return module == want or module.startswith(want.rstrip(".") + ".")


def _architectures(want: list, config: dict, when: Any) -> Judgement:
    archs = config.get("architectures")
    if archs is None:
        return Unknown("architectures", want)
    return None if any(a in want for a in archs) else Unmet("architectures", want, archs)


def _judge_served_by(want: str, config: dict, when: Any) -> Judgement:
    if config.get("architectures") is None:
        return Unknown("served_by", want)
    served, matched = config.get("served_by") or {}, matched_architectures(when, config)
    if any(served_ok(want, served.get(a)) for a in matched):
        return None
    if any(served.get(a) is None for a in matched):
        return Unknown("served_by", want)
    return Unmet("served_by", want, {a: served.get(a) for a in matched})


def _equals(name: str) -> Callable[[Any, dict, Any], Judgement]:
    def judge(want: Any, config: dict, when: Any) -> Judgement:
        got = config.get(name)
        if got is None:
            return Unknown(name, want)
        return None if got == want else Unmet(name, want, got)
    return judge


def _one_of(name: str) -> Callable[[Any, dict, Any], Judgement]:
    def judge(want: list, config: dict, when: Any) -> Judgement:
        got = config.get(name)
        if got is None:
            return Unknown(name, want)
        return None if got in want else Unmet(name, want, got)
    return judge


def _stated(name: str) -> Callable[[Any, dict, Any], str]:
    return lambda want, config, when: f"{name} {config.get(name)}"


#: (specifier, release) -> admitted; the start-up cache fills it for the installed release (`remember_admits`), so a
#: process served from the cache never compiles packaging's specifier grammar (~6 ms of CPU per process)
ADMITS: dict[tuple[str, str], bool] = {}


def admits(specifier: str, vllm_version: str) -> bool:
    """Whether a `when.vllm` specifier admits this release."""
    key = (specifier, vllm_version)
    if key not in ADMITS:  # packaging only here: a process served from the start-up cache never imports it
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        ADMITS[key] = Version(vllm_version) in SpecifierSet(specifier, prereleases=True)
    return ADMITS[key]


def _vllm(want: str, facts: Any) -> Judgement:
    return None if admits(want, facts.vllm_version) else Unmet("vllm", want, facts.vllm_version)


def _env(want: dict, facts: Any) -> Judgement:
    for name, value in want.items():
        got = facts.env.get(name)
        if got != value:
            return Unmet(f"env.{name}", "unset" if value is None else repr(value),
                         "unset" if got is None else repr(got))
    return None


def _platform(want: list, facts: Any) -> Judgement:
    if facts.platform is None:
        return Unknown("platform", want)
    return None if facts.platform in want else Unmet("platform", want, facts.platform)


PRECONDITIONS: tuple[Precondition, ...] = (
    Precondition("vllm", "import", "Optional[VersionSpec]", None, _vllm),
    Precondition("platform", "import", 'Optional[list[Literal["cuda", "rocm", "cpu", "xpu", "tpu"]]]', None,
                 _platform),
    Precondition("env", "import", "Optional[dict[Annotated[str, Field(pattern=ENV_NAME)], Optional[str]]]",
                 "name -> required value; null means the variable must be unset", _env),
    Precondition("architectures", "config", "Optional[list[Annotated[str, Field(min_length=1)]]]",
                 "exact architecture names (any of); never substrings", _architectures,
                 lambda want, config, when: f"architecture {', '.join(matched_architectures(when, config))}",
                 _read_architectures),
    Precondition("served_by", "config", "Optional[str]",
                 "'out_of_tree', 'vllm', or a module prefix the registry must resolve to", _judge_served_by,
                 lambda want, config, when: "served by " + ", ".join(
                     str((config.get("served_by") or {}).get(a)) for a in matched_architectures(when, config))
                 + f" ({want})", _read_served_by),
    Precondition("runner", "config", 'Optional[Literal["v1", "v2"]]', None, _equals("runner"), _stated("runner"),
                 lambda vllm_config, facts: runner_of(vllm_config)),
    Precondition("prefix_caching", "config", "Optional[bool]", None, _equals("prefix_caching"),
                 _stated("prefix_caching"), _read_prefix_caching),
    Precondition("speculative", "config", "Optional[bool]", None, _equals("speculative"), _stated("speculative"),
                 _read_speculative),
    Precondition("cudagraph_mode", "config", "Optional[list[str]]", None, _one_of("cudagraph_mode"),
                 _stated("cudagraph_mode"), _read_cudagraph_mode),
)

IMPORT_STAGE = tuple(p for p in PRECONDITIONS if p.stage == "import")
CONFIG_STAGE = tuple(p for p in PRECONDITIONS if p.stage == "config")
