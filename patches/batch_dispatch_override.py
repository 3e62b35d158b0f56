"""Batch-dispatch override: a still-prefilling row never makes a step "uniform decode".

Wraps `GPUModelRunner._determine_batch_execution_and_padding` (see the YAML for
why). Arguments are forwarded verbatim; the only change is
`force_uniform_decode=False`, passed as vLLM's own parameter (by keyword, or in
its positional slot if a caller ever passes it positionally as None).

Which runners: decided once per runner instance (the answer is kept on the
runner) from the architectures of its model config, which must be among the
YAML's `when.architectures`, and the class serving it, which must satisfy the
YAML's `when.served_by`: the loaded model's class once the model is loaded,
else the class vLLM's registry resolves the architecture to.

Counts: every real step of a plugin runner is counted in ints on a per-process
`Counts` object (one add each); the loader's detail hook copies them into this
patch's record (`detail`) at every flush, so `vllm-patchkit status` shows them.
Cost per step: one dict lookup for the runner's decision, one numpy comparison
over the rows, a few int increments.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any, Optional

from vllm_patchkit import runtime
from vllm_patchkit.declare import parse_patch
from vllm_patchkit.preconditions import served_ok, served_by_module

log = logging.getLogger("vllm.patchkit")

PATCH = parse_patch(Path(__file__).with_suffix(".yaml"))
ARCHITECTURES = frozenset(PATCH.when.architectures or ())
SERVED_BY = PATCH.when.served_by
RUNNER_ATTR = "_vllm_patchkit_batch_dispatch"  # on each runner: the Counts (plugin's) or None
PARAM = "force_uniform_decode"

_positions: Optional[dict[str, int]] = None


class Counts:
    """One process's counts; also the loader's detail hook that copies them into the record."""

    __slots__ = ("seen", "overridden", "decode_shaped", "modes", "runners")

    def __init__(self) -> None:
        self.seen = self.overridden = self.decode_shaped = 0
        self.modes: dict[Any, int] = {}  # CUDAGraphMode -> steps dispatched to it
        self.runners: list[str] = []  # one line per runner decided

    def as_detail(self) -> dict:
        return {
            "steps_seen": self.seen,
            "steps_overridden": self.overridden,
            "steps_overridden_decode_shaped": self.decode_shaped,
            "cudagraph_modes": {getattr(m, "name", str(m)): n for m, n in self.modes.items()},
            "runners": list(self.runners),
        }

    def __call__(self, records: dict) -> None:
        rec = records.get(PATCH.id)
        if rec is not None:
            rec.detail.update(self.as_detail())


# Counts of runners in a process without a loader (the patch installed by hand): kept, never lost.
ORPHAN = Counts()


def counts_for_this_process() -> Counts:
    """The Counts registered with this process's loader (registered on first use)."""
    loader = runtime.current()
    if loader is None:
        return ORPHAN
    for hook in loader.detail_hooks:
        if isinstance(hook, Counts):
            return hook
    counts = Counts()
    loader.detail_hooks.append(counts)
    return counts


def _param_positions(original) -> dict[str, int]:
    """Positional index (self included) of each parameter of the upstream function."""
    global _positions
    if _positions is None:
        _positions = {name: i for i, name in enumerate(inspect.signature(original).parameters)}
    return _positions


def _served_module(runner: Any, arch: str) -> Optional[str]:
    model = runner.__dict__.get("model")
    if model is not None:
        try:
            model = runner.get_model()  # unwraps vLLM's cudagraph wrappers
        except Exception:
            pass
        return type(model).__module__
    return served_by_module(arch)


def plugin_model(runner: Any) -> tuple[bool, str]:
    """Is this runner's model the plugin's? (answer, one-line reason)."""
    archs = list(getattr(runner.model_config, "architectures", None) or [])
    matched = [a for a in archs if a in ARCHITECTURES]
    if not matched:
        return False, f"architectures {archs} not in {sorted(ARCHITECTURES)}"
    module = _served_module(runner, matched[0])
    if SERVED_BY is not None and not served_ok(SERVED_BY, module):
        return False, f"{matched[0]} served by {module}, not {SERVED_BY}"
    return True, f"{matched[0]} served by {module}"


def decide(runner: Any) -> Optional[Counts]:
    """Decide once for this runner; keep the answer on it. Returns the Counts to count into, or None."""
    ok, why = plugin_model(runner)
    counts = counts_for_this_process()
    counts.runners.append(f"{type(runner).__name__}: {'plugin' if ok else 'not plugin'} ({why})")
    sink = counts if ok else None
    runner.__dict__[RUNNER_ATTR] = sink
    log.info("vllm-patchkit: %s: %s %s the override (%s)", PATCH.key, type(runner).__name__,
             "gets" if ok else "does not get", why)
    return sink


def determine_batch_execution_and_padding(original, *args, **kwargs):
    """Wrap of GPUModelRunner._determine_batch_execution_and_padding(self, ...)."""
    runner = args[0]
    d = runner.__dict__
    sink = d[RUNNER_ATTR] if RUNNER_ATTR in d else decide(runner)
    if sink is None:
        return original(*args, **kwargs)
    pos = _positions or _param_positions(original)
    i = pos[PARAM]
    if (args[i] if len(args) > i else kwargs.get(PARAM)) is not None:
        return original(*args, **kwargs)  # capture / dummy run: the caller decided
    j = pos["num_reqs"]
    num_reqs = args[j] if len(args) > j else kwargs["num_reqs"]
    batch = runner.input_batch
    sink.seen += 1
    if (batch.num_computed_tokens_cpu[:num_reqs] < batch.num_prompt_tokens[:num_reqs]).any():
        sink.overridden += 1
        if _decode_shaped(runner, pos, args, kwargs, num_reqs):
            sink.decode_shaped += 1
        if len(args) > i:
            args = args[:i] + (False,) + args[i + 1:]
        else:
            kwargs[PARAM] = False
    result = original(*args, **kwargs)
    modes = sink.modes
    mode = result[0]
    modes[mode] = modes.get(mode, 0) + 1
    return result


def _decode_shaped(runner: Any, pos: dict[str, int], args: tuple, kwargs: dict, num_reqs: int) -> bool:
    """Would vLLM's own shape test have called this step uniform decode?"""

    def arg(name):
        k = pos[name]
        return args[k] if len(args) > k else kwargs[name]

    return bool(runner._is_uniform_decode(
        max_num_scheduled_tokens=arg("max_num_scheduled_tokens"),
        uniform_decode_query_len=runner.uniform_decode_query_len,
        num_tokens=arg("num_tokens"),
        num_reqs=num_reqs,
    ))
