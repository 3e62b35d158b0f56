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
from typing import Any, Mapping, Optional

from msgspec import Struct, field

from vllm_patchkit.declaration.precondition_table import (ADMITS, CONFIG_STAGE, IMPORT_STAGE, V1_RUNNER_MODULE,
                                                          V2_RUNNER_MODULE, Judgement, Unknown, Unmet, admits,
                                                          runner_of, served_by_module, served_ok)
from vllm_patchkit.declaration.schema import When


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


def config_facts(vllm_config: Any) -> dict:
    """The configuration facts preconditions read, as plain data (also shown by `status`): one per config-stage row
    of the table, read in its order."""
    facts: dict = {}
    for row in CONFIG_STAGE:
        facts[row.name] = row.read(vllm_config, facts)
    return facts


def version_matches(when: When, vllm_version: str) -> bool:
    """Whether a patch version's `when.vllm` admits this release (no range: every release)."""
    return when.vllm is None or admits(when.vllm, vllm_version)


def admits_for(specifiers, vllm_version: str) -> dict[str, bool]:
    """What each `when.vllm` specifier says of one release (written into the start-up cache)."""
    return {s: admits(s, vllm_version) for s in specifiers}


def remember_admits(answers: dict[str, bool], vllm_version: str) -> None:
    """Answers computed by an earlier process for this release (read from the start-up cache)."""
    for spec, ok in answers.items():
        if isinstance(spec, str) and isinstance(ok, bool):
            ADMITS.setdefault((spec, vllm_version), ok)


def held(when: When, config: dict) -> str:
    """The declared config-time preconditions with the values that satisfied them (for messages)."""
    parts = [row.held(getattr(when, row.name), config, when) for row in CONFIG_STAGE
             if getattr(when, row.name) is not None]
    parts += [f"{name}={want}" for name, want in (when.env or {}).items()]
    return "; ".join(parts) or "it has no preconditions"


def unmet_at_import(when: When, facts: Facts) -> Judgement:
    """The first import-time precondition that does not hold (`Unmet`) or cannot be read (`Unknown`), in the
    table's order."""
    for row in IMPORT_STAGE:
        want = getattr(when, row.name)
        if want is not None:
            judged = row.judge(want, facts)
            if judged is not None:
                return judged
    return None


def unmet_at_config(when: When, config: dict) -> Judgement:
    """The first config-time precondition that does not hold (`Unmet`); if none does not, the first whose fact is
    unknown (`Unknown`): a known false part decides the conjunction, an unknown part never does."""
    unknown: Optional[Unknown] = None
    for row in CONFIG_STAGE:
        want = getattr(when, row.name)
        if want is None:
            continue
        judged = row.judge(want, config, when)
        if isinstance(judged, Unmet):
            return judged
        unknown = unknown or judged
    return unknown


def model_matches(vllm_config: Any, architectures: list[str], served_by: Optional[str] = None) -> bool:
    """Whether the model of `vllm_config` is one of `architectures` (exact names) served as `served_by`, by the
    rule of a patch's `when`: for a set's code that judges a model without a patch context (an adapter)."""
    when = When(architectures=list(architectures), served_by=served_by)
    return unmet_at_config(when, config_facts(vllm_config)) is None


__all__ = ["Facts", "Judgement", "Unknown", "Unmet", "V1_RUNNER_MODULE", "V2_RUNNER_MODULE", "config_facts",
           "current_platform_name", "held", "model_matches", "runner_of", "served_by_module", "served_ok",
           "unmet_at_config", "unmet_at_import", "version_matches"]
