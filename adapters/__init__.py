"""Model adapters: what a model family supplies to the KV-config hook (see protocol.py).

``REGISTRY`` holds the adapters the hook consults; the DeepSeek-V4 adapter is
built in. A plugin with its own family (or its own proxy layer name) registers
an adapter from its general-plugin entry point, before vLLM sizes the KV cache.
``SLOT_EVENTS`` (slot_events.py) is where its worker-side slot allocator hears
which requests finished, were preempted or resumed (patch image-slot-events).
"""

from __future__ import annotations

from .deepseek_v4 import DeepseekV4Adapter
from .protocol import (
    DEMAND_ENV,
    INTERVAL_ENV,
    ByteImageCopier,
    CheckpointSpec,
    ModelAdapter,
    Placement,
    Registry,
    Segment,
    Sizing,
    StateCopier,
)
from .slot_events import SLOT_EVENTS, SlotEvents

REGISTRY = Registry([DeepseekV4Adapter()])
register = REGISTRY.register
unregister = REGISTRY.unregister

__all__ = [
    "DEMAND_ENV",
    "INTERVAL_ENV",
    "REGISTRY",
    "SLOT_EVENTS",
    "ByteImageCopier",
    "CheckpointSpec",
    "DeepseekV4Adapter",
    "ModelAdapter",
    "Placement",
    "Registry",
    "Segment",
    "Sizing",
    "SlotEvents",
    "StateCopier",
    "register",
    "unregister",
]
