"""KV-config hook: size the KV pool of a model with per-request state slots (via its adapter).

Wraps vLLM's ``get_kv_cache_configs`` (and EngineCore's by-value copy): version 1 in
``kv_cache_utils`` up to vLLM 0.32, version 2 in ``kv_cache_planning`` from 0.33 (see
``get_kv_cache_configs_planning`` for what differs). Per call:

1. **Pass through** untouched unless a registered adapter's proxy layer is among
   the KV specs (vLLM's own DeepSeek-V4/V4.1 and every other model).
2. **Price** the proxy and the image layers at the adapter's real bytes per
   block, so vLLM's block count is the model's real one.
3. **Check the minimum pool** before vLLM does: one max-length request's peak is
   ``ceil(max_model_len / block_size)`` proxy blocks + 2 working blocks per image
   group (the running block and the previous one, with or without async scheduling:
   the image-publish release pass frees older ones itself, as the native plugin does)
   + vLLM's null block, out of ``physical - withheld`` blocks, where ``withheld`` is
   the adapter's count at this physical block count (``Sizing.withheld_for``: the
   contiguous ``ceil(slots * slot / page)``, or more for a layout that carves its
   planes, e.g. DeepSeek-V4). One block short stops start-up with the numbers and a
   remedy that works for how the block count was set (``--num-gpu-blocks-override``
   pins it; otherwise memory); the physical count it names is searched with the
   adapter's count (``Sizing.physical_for``), not solved from a formula. A draft
   model's proxy (speculative decoding) is priced like the proxy and has its own
   tensor of the same block count, carving its own slots from its own tail.
4. Call vLLM's own function (its own grouping, auto-fit and checks).
5. With ``--max-model-len -1``, **re-run vLLM's own auto-fit**
   (``_auto_fit_max_model_len``) over the non-image groups against the blocks left
   (``physical - withheld - null - the peak per image group``); vLLM writes the shorter
   length into ``model_config.max_model_len`` as usual, and EngineCore sends it
   to the workers and the API server as it does after its own auto-fit.
6. **Withhold** the slot area as a tail: ``num_blocks = physical - withheld`` (the
   adapter's count at this physical block count);
   the tensors keep their size, so the slots keep their backing bytes.

Every decision (numbers included) is logged once and noted in this patch's
record (``detail.last_call``, ``detail.decisions``) through the context, so
``vllm-patchkit status --json`` shows it. The parameters it reads are declared
in the YAML (``params``), the auto-fit helper it re-runs in ``uses`` (pinned).
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from patchkit_deepseek_v4.adapters import REGISTRY, ModelAdapter, Placement, Sizing
from vllm_patchkit import PatchContext, Refusal

log = logging.getLogger("vllm.patchkit")

PATCH_ID = "kv-config-hook"
NULL_BLOCKS = 1  # vLLM's BlockPool keeps block 0 as its null block
#: vLLM's auto-fit helper this hook re-runs (declared and pinned in the YAML's `uses`).
AUTO_FIT = "_auto_fit_max_model_len"


class PoolTooSmall(Refusal):
    """The KV pool cannot hold one max-length request once the slots are withheld."""


# ---------------------------------------------------------------------------
# The pool plan: every number the hook decides with, as one value
# ---------------------------------------------------------------------------


@dataclass
class PoolPlan:
    adapter: str
    block_size: int
    page_bytes: int
    physical: int
    withheld: int
    num_slots: int
    slot_bytes: int
    k: int
    image_groups: int
    working_per_group: int
    interval_tokens: int
    publishes: bool
    pinned_by_override: bool
    auto_fit: bool
    max_model_len: int = 0
    max_model_len_vllm_alone: Optional[int] = None
    #: The protocol's contiguous count (``Sizing.withheld_blocks``), the lower bound of ``withheld``.
    withheld_contiguous: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    #: The sizing ``withheld`` came from: the count at any other physical block count (searches).
    sizing: Optional[Sizing] = field(default=None, repr=False, compare=False)

    @property
    def working_blocks(self) -> int:
        return self.working_per_group * self.image_groups

    @property
    def usable(self) -> int:
        """Blocks vLLM's pool gets (null block included)."""
        return self.physical - self.withheld

    @property
    def left_for_history(self) -> int:
        """Blocks one request's paged history may take: physical - withheld - null - working."""
        return self.physical - self.withheld - NULL_BLOCKS - self.working_blocks

    def history_blocks(self, max_model_len: int) -> int:
        return math.ceil(max_model_len / self.block_size)

    def minimum_physical(self, max_model_len: int) -> int:
        """The fewest physical blocks that hold one request of ``max_model_len`` tokens at its peak.

        With the sizing, searched on the adapter's count at each physical block count (a carve need not be
        linear, or invertible); contiguous, that is ``history + working + null + withheld``."""
        need = self.history_blocks(max_model_len) + self.working_blocks + NULL_BLOCKS
        if self.sizing is None:
            return need + self.withheld
        return self.sizing.physical_for(need)

    def fit_slots(self, history_blocks: int) -> int:
        """The most slots, fewer than ``num_slots``, with which one request of ``history_blocks`` blocks fits
        in these ``physical`` blocks (0: none). Searched on the adapter's count; contiguous, that is
        ``(physical - null - working - history) * page // slot``."""
        spare = self.physical - NULL_BLOCKS - self.working_blocks - history_blocks
        if self.sizing is None:
            return max(0, min(self.num_slots - 1, (spare * self.page_bytes) // self.slot_bytes if spare > 0 else 0))

        def fits(slots: int) -> bool:
            return replace(self.sizing, num_slots=slots).withheld_for(self.physical) <= spare

        lo, hi = 0, self.num_slots  # fits(lo) (no slot), not fits(hi) (the refused count)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def as_dict(self) -> dict:
        d = asdict(replace(self, sizing=None))
        del d["sizing"]
        d.update(usable=self.usable, left_for_history=self.left_for_history, working_blocks=self.working_blocks)
        return d


def _why_per_group(plan: PoolPlan) -> str:
    """How the working blocks per image group were counted, for the refusal message."""
    return f"{plan.working_per_group} x {plan.image_groups} image groups"


def _physical_blocks(adapter: ModelAdapter, vllm_config, kv_cache_specs, available_memory, page_bytes: int) -> int:
    """The block count vLLM will choose: the override if set, else the smallest worker's memory / page / the
    proxy tensors (the proxy and a draft model's proxy each get a tensor of that many blocks; the image
    groups share the proxy's)."""
    override = vllm_config.cache_config.num_gpu_blocks_override
    if override is not None:
        return int(override)
    return min(int(mem) // page_bytes // max(1, sum(1 for n in specs if adapter.is_proxy_layer(n)))
               for specs, mem in zip(kv_cache_specs, available_memory) if specs)


def _refusal(plan: PoolPlan, max_model_len: Optional[int]) -> PoolTooSmall:
    """The start-up message: the numbers, then remedies that work for how the block count was set."""
    bs = plan.block_size
    if max_model_len is None:  # --max-model-len -1: not even one block of history fits
        need, asked = 1, "--max-model-len -1 (auto-fit) needs at least 1"
        target = plan.minimum_physical(bs)
    else:
        need = plan.history_blocks(max_model_len)
        asked = f"max_model_len={max_model_len} needs ceil({max_model_len}/{bs}) = {need}"
        target = plan.minimum_physical(max_model_len)
    have = plan.left_for_history
    carved = ""
    if plan.withheld_contiguous is not None and plan.withheld != plan.withheld_contiguous:
        carved = (f" (the slots' bytes alone take {plan.withheld_contiguous} blocks; the adapter's carve of "
                  f"{plan.physical} blocks withholds the rest)")
    head = (
        f"{plan.adapter} KV pool too small for one max-length request: {plan.physical} blocks of "
        f"{plan.page_bytes} B (block size {bs}) - {plan.withheld} withheld for {plan.num_slots} state slots "
        f"of {plan.slot_bytes} B{carved} - {NULL_BLOCKS} vLLM null block - {plan.working_blocks} image working blocks "
        f"({_why_per_group(plan)}) = {have} blocks for the paged history, "
        f"but {asked}; {target - plan.physical} block(s) short."
    )
    remedies = []
    if have >= 1:
        remedies.append(f"lower --max-model-len to at most {have * bs} (or pass --max-model-len -1 to fit it)")
    if plan.pinned_by_override:
        remedies.append(f"raise --num-gpu-blocks-override to at least {target} (it pins the block count; "
                        "more memory does not change it)")
    else:
        remedies.append(f"give the KV cache at least {target} blocks ({target * plan.page_bytes} B, now "
                        f"{plan.physical * plan.page_bytes} B): raise --gpu-memory-utilization "
                        "(VLLM_CPU_KVCACHE_SPACE on CPU) or --kv-cache-memory-bytes")
    fit_slots = plan.fit_slots(max(need, 1))
    if 1 <= fit_slots < plan.num_slots:
        remedies.append(f"lower --max-num-seqs to at most {fit_slots} (each running request withholds a "
                        f"{plan.slot_bytes} B state slot)")
    return PoolTooSmall(f"vllm-patchkit: {PATCH_ID}: {head} Remedy: " + "; or ".join(remedies) + ".")


# ---------------------------------------------------------------------------
# Pricing, image groups
# ---------------------------------------------------------------------------


def _priced(spec: Any, page_bytes: int, layer: str) -> Any:
    """The spec with its page padded up to the adapter's real bytes per block."""
    current = spec.page_size_bytes
    if current == page_bytes:
        return spec
    if current > page_bytes or not hasattr(spec, "page_size_padded"):
        raise ValueError(
            f"vllm-patchkit: {PATCH_ID}: KV spec of {layer} has {current} B per block, the adapter's real "
            f"bytes per block are {page_bytes} B: the model and the adapter disagree about the layout")
    return replace(spec, page_size_padded=page_bytes)


def _priced_specs(adapter: ModelAdapter, kv_cache_specs: list[dict], page_bytes: int) -> list[dict]:
    out = []
    for worker in kv_cache_specs:
        priced = {}
        for name, spec in worker.items():
            if adapter.is_proxy_layer(name) or adapter.is_image_layer(name):
                spec = _priced(spec, page_bytes, name)
            priced[name] = spec
        out.append(priced)
    return out


def _image_layers(adapter: ModelAdapter, kv_cache_specs: list[dict]) -> list[str]:
    names: dict[str, None] = {}
    for worker in kv_cache_specs:
        for name in worker:
            if adapter.is_image_layer(name):
                names[name] = None
    return list(names)


def _is_image_group(adapter: ModelAdapter, group) -> bool:
    return any(adapter.is_image_layer(n) for n in group.layer_names)


# ---------------------------------------------------------------------------
# The wrap
# ---------------------------------------------------------------------------


def _decided(ctx: PatchContext, detail: dict) -> None:
    """Count the call's decision and note it (with its numbers) in this patch's record."""
    ctx.count("decisions." + detail["decision"])
    ctx.note(last_call=detail)


def _check_block_size(adapter: ModelAdapter, kv_cache_specs: list[dict], images: list[str]) -> None:
    """The proxy and image layers must use the adapter's block size: pages and images are sized per block of
    that many tokens, and a serve at another --block-size would mix units silently."""
    for worker in kv_cache_specs:
        for name in [n for n in worker if adapter.is_proxy_layer(n)] + images:
            spec = worker.get(name)
            got = getattr(spec, "block_size", None)
            if spec is not None and got != adapter.block_size:
                raise ValueError(
                    f"vllm-patchkit: {PATCH_ID}: layer {name} has block size {got}, the {adapter.name} adapter's "
                    f"checkpoint spec is per {adapter.block_size}-token block: serve with "
                    f"--block-size {adapter.block_size}")


def plan_pool(adapter: ModelAdapter, vllm_config, kv_cache_specs, available_memory,
              sizing: Optional[Sizing] = None, placement: Optional[Placement] = None) -> PoolPlan:
    """Everything the hook decides before calling vLLM; raises PoolTooSmall when one request cannot fit."""
    sizing = sizing or adapter.sizing(vllm_config)
    placement = placement or adapter.placement()
    images = _image_layers(adapter, kv_cache_specs)
    if images and len(images) != sizing.k:
        raise ValueError(
            f"vllm-patchkit: {PATCH_ID}: the model registered {len(images)} {adapter.name} image layers, the "
            f"adapter's checkpoint spec needs k = {sizing.k} (an image of {sizing.spec.image_bytes} B in pages "
            f"of {sizing.page_bytes} B): the model and the adapter disagree about the image")
    _check_block_size(adapter, kv_cache_specs, images)
    mc = vllm_config.model_config
    physical = _physical_blocks(adapter, vllm_config, kv_cache_specs, available_memory, sizing.page_bytes)
    plan = PoolPlan(
        adapter=adapter.name,
        block_size=adapter.block_size,
        page_bytes=sizing.page_bytes,
        physical=physical,
        withheld=sizing.withheld_for(physical),
        num_slots=sizing.num_slots,
        slot_bytes=sizing.spec.slot_bytes,
        k=sizing.k,
        image_groups=len(images),
        working_per_group=placement.working_blocks_per_group,
        interval_tokens=placement.interval_tokens,
        publishes=placement.publishes,
        pinned_by_override=vllm_config.cache_config.num_gpu_blocks_override is not None,
        auto_fit=mc.original_max_model_len == -1,
        max_model_len=int(mc.max_model_len),
        withheld_contiguous=sizing.withheld_blocks,
        sizing=sizing,
    )
    if images and not placement.publishes:
        plan.notes.append("interval 0: no image is published; the image groups' working blocks still count")
    if plan.auto_fit:
        if plan.left_for_history < 1:
            raise _refusal(plan, None)
    elif plan.left_for_history < plan.history_blocks(plan.max_model_len):
        raise _refusal(plan, plan.max_model_len)
    return plan


def get_kv_cache_configs(wrapped, instance, args, kwargs, ctx):
    """Version 1: wrap of vllm.v1.core.kv_cache_utils:get_kv_cache_configs (vLLM < 0.33)."""
    return _sized(wrapped, args, kwargs, ctx, regroup=None,
                  refit=lambda vllm_config, groups, left: ctx.use(AUTO_FIT)(vllm_config, groups, left))


def get_kv_cache_configs_planning(wrapped, instance, args, kwargs, ctx):
    """Version 2: wrap of vllm.v1.core.kv_cache_planning:get_kv_cache_configs (vLLM >= 0.33).

    There EngineCore groups the layers before the call (``global_kv_cache_groups``), from specs this hook
    has not priced yet, so the priced specs are regrouped with vLLM's own ``get_global_kv_cache_groups``;
    and the auto-fit helper takes the KV-cache-config builder vLLM plans with as its first argument."""

    def regroup(args, kwargs, vllm_config, priced):
        groups = ctx.use("get_global_kv_cache_groups")(vllm_config, priced)
        return ctx.with_arg(args, kwargs, "global_kv_cache_groups", groups)

    def refit(vllm_config, groups, left):
        builder = ctx.use("get_kv_cache_config_builder")(vllm_config)
        ctx.use(AUTO_FIT)(builder, vllm_config, groups, left)

    return _sized(wrapped, args, kwargs, ctx, regroup=regroup, refit=refit)


def _extensible_refusal(adapter: ModelAdapter, vllm_config) -> Optional[str]:
    """vLLM >= 0.34's extensible KV cache (on by default on CUDA/ROCm; `cache_config.enable_extensible_kv_cache`
    settled by VllmConfig) re-fits max_model_len after warmup over every group and commits memory for the first
    `num_blocks` blocks only: the slot area this hook withholds past them would not survive it. Refused for the
    adapter's model, with the flag that turns it off; None where the release has no such cache or it is off."""
    if getattr(vllm_config.cache_config, "enable_extensible_kv_cache", None) is not True:
        return None
    return (f"vllm-patchkit: {PATCH_ID}: vLLM's extensible KV cache (cache_config.enable_extensible_kv_cache) is on "
            f"for {adapter.name}: after warmup it re-fits max_model_len over every group, the image groups "
            "included, and keeps memory only for the blocks it counts, which drops the per-request slot area "
            "this hook withholds from the pool. Serve with --no-enable-extensible-kv-cache")


def _sized(wrapped, args, kwargs, ctx: PatchContext, *, regroup, refit):
    """Steps 1-6 of the module docstring; `regroup`/`refit` are what differs between vLLM releases."""
    vllm_config = ctx.arg(args, kwargs, "vllm_config")
    kv_cache_specs = ctx.arg(args, kwargs, "kv_cache_specs")
    available_memory = ctx.arg(args, kwargs, "available_memory")
    adapter = REGISTRY.for_kv_specs(kv_cache_specs)
    if adapter is None:
        _decided(ctx, {"decision": "passthrough", "reason": "no registered adapter's proxy layer among the KV specs",
                       "layers": sum(len(w) for w in kv_cache_specs)})
        return wrapped(*args, **kwargs)

    extensible = _extensible_refusal(adapter, vllm_config)
    if extensible is not None:
        _decided(ctx, {"decision": "refused", "adapter": adapter.name, "message": extensible})
        ctx.refuse(extensible)
    try:
        plan = plan_pool(adapter, vllm_config, kv_cache_specs, available_memory)
    except PoolTooSmall as exc:
        _decided(ctx, {"decision": "refused", "adapter": adapter.name, "message": str(exc)})
        ctx.refuse(str(exc), exc=exc)

    priced = _priced_specs(adapter, kv_cache_specs, plan.page_bytes)
    args, kwargs = ctx.with_arg(args, kwargs, "kv_cache_specs", priced)
    if regroup is not None:
        args, kwargs = regroup(args, kwargs, vllm_config, priced)
    configs = wrapped(*args, **kwargs)

    for cfg in configs:
        if cfg.num_blocks != plan.physical:
            raise RuntimeError(
                f"vllm-patchkit: {PATCH_ID}: vLLM made {cfg.num_blocks} blocks, the plan expected "
                f"{plan.physical} at {plan.page_bytes} B per block: layers other than the proxy and the image "
                "layers change the pool's bytes per block; the adapter must price them")
        image_groups = [g for g in cfg.kv_cache_groups if _is_image_group(adapter, g)]
        if image_groups and (len(image_groups) != plan.image_groups
                             or any(len(g.layer_names) != 1 for g in image_groups)):
            raise RuntimeError(
                f"vllm-patchkit: {PATCH_ID}: vLLM grouped the {plan.image_groups} image layers into "
                f"{[g.layer_names for g in image_groups]}; each must be its own single-layer group")

    if plan.auto_fit:
        plan.max_model_len_vllm_alone = int(vllm_config.model_config.max_model_len)
        groups = [[g for g in cfg.kv_cache_groups if not _is_image_group(adapter, g)] for cfg in configs]
        left = [plan.left_for_history * plan.page_bytes if g else 0 for g in groups]
        refit(vllm_config, groups, left)
    plan.max_model_len = int(vllm_config.model_config.max_model_len)
    if plan.left_for_history < plan.history_blocks(plan.max_model_len):
        _decided(ctx, {"decision": "refused", "adapter": adapter.name, "plan": plan.as_dict()})
        err = _refusal(plan, plan.max_model_len)
        ctx.refuse(str(err), exc=err)

    for cfg in configs:
        cfg.num_blocks = plan.usable

    log.info(
        "vllm-patchkit: %s: %s pool: %d physical blocks of %d B (block %d), %d withheld for %d slots of %d B, "
        "null 1, %d image working blocks (%d groups x %d; k=%d, interval %d%s) -> %d blocks "
        "in vLLM's pool, "
        "max_model_len %d%s",
        PATCH_ID, plan.adapter, plan.physical, plan.page_bytes, plan.block_size, plan.withheld, plan.num_slots,
        plan.slot_bytes, plan.working_blocks, plan.image_groups, plan.working_per_group,
        plan.k, plan.interval_tokens,
        "" if plan.publishes else " (no image published)", plan.usable, plan.max_model_len,
        f" (re-fit; vLLM alone {plan.max_model_len_vllm_alone})" if plan.auto_fit else "",
    )
    _decided(ctx, {"decision": "sized", "plan": plan.as_dict()})
    return configs
