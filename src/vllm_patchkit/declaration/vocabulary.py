"""The words of a declaration: the patterns its names follow, the kinds, the process roles, the call frequencies,
and the base every declared object shares. Hand-written; the objects made of them are generated (schema.py, pins.py).
"""

from __future__ import annotations

from enum import Enum

from msgspec import Struct

from vllm_patchkit.declaration.kinds import DECLARATIONS

PATCH_ID = r"^[a-z0-9][a-z0-9._-]*$"
TARGET = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
ENV_NAME = r"^[A-Z_][A-Z0-9_]*$"
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
CONFIG_FIELD = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


#: How a patch changes vLLM: one member per row of declaration/kinds.py (its declarative part).
Kind = Enum("Kind", [(d.name, d.name) for d in DECLARATIONS], type=str, module=__name__)
Kind.__doc__ = "How a patch changes vLLM (declaration/kinds.py: what each kind needs and takes)."


class Role(str, Enum):
    """vLLM's process roles; the plugin entry point runs once in each."""

    frontend = "frontend"  # API server / LLM() process, before VllmConfig exists
    engine_core = "engine_core"
    worker = "worker"
    inspect = "inspect"  # vLLM's short-lived model-inspection subprocess


class Frequency(str, Enum):
    """How often a patched callable is expected to run (for inert detection)."""

    per_step = "per_step"
    per_request = "per_request"
    at_startup = "at_startup"
    rare = "rare"
    never_counted = "never_counted"


class Declared(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: immutable, every field by name, an unknown key refused when read back."""
