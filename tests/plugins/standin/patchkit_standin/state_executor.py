"""A stand-in executor: the plugin's worker side (KV specs, state slots, image copies) without its GPU model.

Serve with ``--distributed-executor-backend patchkit_standin.state_executor.StateExecutor`` (vLLM resolves a
qualified class name with ``resolve_obj_by_qualname``, ``Executor.get_class``). Everything above the executor is
vLLM's own: the API server, EngineCore, its KV sizing (``get_kv_cache_configs``, through the KV-config hook),
the ``Scheduler``/``AsyncScheduler`` with their ``KVCacheManager``, hybrid coordinator, ``MambaManager`` align
groups and ``BlockPool`` prefix cache, and the image-publish patches on them. What stands in is the worker:

* **KV specs** with the plugin's shape, read from the model's adapter (the registry's adapter for the served
  config, i.e. the real ``DeepseekV4Adapter`` for a V4-shaped config.json): the adapter's proxy layer with an
  attention spec (a small nominal page, priced by the KV-config hook at the adapter's real page) and the
  adapter's ``image_layer_names(k)`` as ``MambaSpec`` align layers, one per image group;
* **available memory**: ``PATCHKIT_STANDIN_KV_BLOCKS`` (default 2048) pages of the adapter's real page, so the
  hook sizes the pool (its decision is ``sized``; the numbers are in its record);
* **the allocation**: one flat byte buffer of ``physical`` pages; vLLM's pool is its first
  ``num_blocks = physical - withheld`` blocks, the state slots its tail (slot ``i`` at
  ``(physical - withheld) * page + i * slot``, the protocol's rule); images move between a slot and its ``k``
  image blocks with the adapter's own copier (``make_copier``: the reference ``ByteImageCopier`` over the
  adapter's image segments);
* **the state**: each running request has a slot whose image segments hold a digest of the tokens the request
  has computed (a hash chain over the token ids, so equal prefixes give equal digests and any other prefix a
  different one) and its token count, then bytes derived from both that fill every image segment, so a restore
  checks every byte of all ``k`` image blocks;
* **store**: at each step's end (``end = num_computed_tokens + num_scheduled_tokens``) the slot is copied into
  the block holding the running state in each image group, index ``ceil(end / block) - 1`` of the block
  table (vLLM's own align rule, ``mamba_utils.preprocess_mamba``); at an image boundary that block is the one
  the image book files and publishes;
* **restore**: a new (or resumed) request with ``num_computed_tokens = h > 0`` is a prefix hit: its slot is
  restored from its image blocks at index ``h / block - 1`` and the digest found there is compared with the
  digest recomputed from the prompt's token ids (``NewRequestData.prompt_token_ids``): ``restores_right`` /
  ``restores_wrong``;
* **sampling**: a deterministic token from the digest (never a special token), so the API server answers;
* **slots released**: the executor's slot allocator (``on_slot_events``) listens at ``SLOT_EVENTS``
  (``adapters/slot_events.py``), where the patch ``image-slot-events`` hands a plugin the finished, preempted
  and resumed ids from vLLM's runner (``GPUModelRunner._update_states``). No vLLM runner runs in this serve
  (the executor replaces the worker, in EngineCore), so the patch is not applied here and the executor
  delivers the ids from the ``SchedulerOutput`` itself, through the same point (``_hook_applied``).

Async scheduling: vLLM's CPU platform forces ``scheduler_config.async_scheduling = False`` in the front end
(``CpuPlatform.check_and_update_config``); with ``PATCHKIT_STANDIN_ASYNC=1`` the executor sets it back in
EngineCore, where it is built before the scheduler and the batch queue (``max_concurrent_batches``), so
EngineCore runs ``AsyncScheduler`` with ``step_with_batch_queue``; ``execute_model`` returns ``None`` and
``sample_tokens`` the output, as vLLM's workers do.

Counters go into EngineCore's record under ``patchkit_standin.state_executor`` (``vllm_patchkit.runtime.state.count``:
``vllm-patchkit status`` and /metrics show them); the layout and the first wrong restores, with their blocks, go
to a side file: ``<status dir>/<run id>/standin/state-executor-<pid>.json``.
``PATCHKIT_STANDIN_STEP_DELAY_S`` slows each step (to aim aborts at a boundary);
``PATCHKIT_STANDIN_FAULT=store_behind`` (a negative control) stores one block too early, so hits restore
a state that is not the prompt's and count as wrong.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import math
import multiprocessing.util
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from vllm.v1.executor.abstract import Executor
from patchkit_deepseek_v4.adapters import SLOT_EVENTS

logger = logging.getLogger("vllm.patchkit_standin")

BLOCKS_ENV = "PATCHKIT_STANDIN_KV_BLOCKS"
ASYNC_ENV = "PATCHKIT_STANDIN_ASYNC"
DELAY_ENV = "PATCHKIT_STANDIN_STEP_DELAY_S"
#: Negative control: "store_behind" stores the slot one block before the running state's block.
FAULT_ENV = "PATCHKIT_STANDIN_FAULT"
SIDE_DIR = "standin"
SLOT_EVENTS_PATCH = "image-slot-events"
COUNTER_SOURCE = "patchkit_standin.state_executor"  # its counters in the process record
DIGEST_BYTES = 16
EMPTY_DIGEST = b"\0" * DIGEST_BYTES
FIRST_TOKEN = 3  # the tiny tokenizer's special tokens are 0, 1, 2
FLUSH_EVERY_S = 0.5


def chain(digest: bytes, tokens) -> bytes:
    """The state after ``tokens`` from state ``digest``: one hash per token, so it depends on every token and
    its position, and computing it in chunks gives the same value as at once."""
    for t in tokens:
        digest = hashlib.blake2b(digest + int(t).to_bytes(8, "little", signed=True),
                                 digest_size=DIGEST_BYTES).digest()
    return digest


def side_file() -> str:
    from vllm_patchkit.runtime.record import default_status_dir, run_id

    return str(default_status_dir() / run_id() / SIDE_DIR / f"state-executor-{os.getpid()}.json")


@dataclass
class ReqState:
    tokens: list[int]  # prompt + the tokens this executor sampled for it
    prompt_len: int
    slot: Optional[int] = None
    computed: int = 0  # tokens the state has consumed
    digest: bytes = EMPTY_DIGEST
    block_ids: list[list[int]] = field(default_factory=list)  # per KV-cache group, as the scheduler sent them


class StandinWorker:
    """The worker side, in EngineCore's process (``collective_rpc`` calls its methods by name)."""

    def __init__(self, vllm_config):
        from patchkit_deepseek_v4.adapters import REGISTRY

        self.vllm_config = vllm_config
        self.adapter = REGISTRY.for_config(vllm_config)
        if self.adapter is None:
            raise RuntimeError("patchkit_standin StateExecutor: no registered adapter matches the served model "
                               f"({vllm_config.model_config.architectures}); serve a V4-shaped checkpoint with "
                               "PATCHKIT_STANDIN=1")
        self.sizing = self.adapter.sizing(vllm_config)
        self.page = self.sizing.page_bytes
        self.k = self.sizing.k
        self.physical = int(os.environ.get(BLOCKS_ENV) or 2048)
        self.vocab = int(vllm_config.model_config.get_vocab_size())
        self.delay = float(os.environ.get(DELAY_ENV) or 0)
        self.fault = os.environ.get(FAULT_ENV, "")
        self.requests: dict[str, ReqState] = {}
        self.free_slots: list[int] = list(range(self.sizing.num_slots))[::-1]
        self.pending_output = None
        self.copier = None
        self.buffer = None
        self.image_gids: list[int] = []
        self.block_size = self.adapter.block_size
        self.counts = {"steps": 0, "stores": 0, "stores_at_boundary": 0, "restores_right": 0, "restores_wrong": 0,
                       "restores_on_resume": 0, "restores_missing_block": 0, "slot_overflow": 0,
                       "requests": 0, "prefix_hits": 0, "tokens_sampled": 0, "token_gaps": 0,
                       "block_copies": 0, "preempted": 0, "slot_event_steps": 0, "slot_events_by_executor": 0}
        self.wrong: list[dict] = []
        self.hits: list[list] = []  # the first 64 prefix hits (resumes too) as [hit, restored right], in order
        self.layout: dict[str, Any] = {}
        self.path = side_file()
        self._last_flush = 0.0
        self._published: dict[str, int] = {}  # the counts already given to the record (publish)
        self._publish_lock = threading.Lock()
        self._lock = threading.Lock()
        self._hooked: Optional[bool] = None  # image-slot-events applied here? (decided at the first step)
        SLOT_EVENTS.listen(self.on_slot_events)  # the plugin's slot allocator, registered where the hook delivers

    # -- start-up: what EngineCore asks the workers ------------------------------------------------
    def get_kv_cache_spec(self):
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

        bs = self.block_size
        specs = {self.adapter.proxy_layer_name: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1,
                                                                  dtype=torch.uint8)}
        for name in self.adapter.image_layer_names(self.k):
            specs[name] = MambaSpec(block_size=bs, shapes=((self.page,),), dtypes=(torch.uint8,),
                                    mamba_cache_mode="align")
        return specs

    def determine_available_memory(self) -> int:
        return self.physical * self.page

    def get_supported_kv_cache_layouts(self):
        return ["BLHNC"]

    def set_kv_cache_layout(self, layout_name):
        self.layout["kv_cache_layout"] = layout_name

    def initialize_from_config(self, kv_cache_configs):
        import torch

        cfg = kv_cache_configs[0] if isinstance(kv_cache_configs, list) else kv_cache_configs
        groups = cfg.kv_cache_groups
        images = {}
        for gid, g in enumerate(groups):
            for name in g.layer_names:
                if self.adapter.is_image_layer(name):
                    images[int(name.split(".")[2])] = gid
        self.image_gids = [images[i] for i in sorted(images)]
        usable = int(cfg.num_blocks)
        withheld = self.physical - usable
        # The adapter's count for this physical count (a layout may carve more than the contiguous lower bound).
        expected = (self.sizing.withheld_for(self.physical) if hasattr(self.sizing, "withheld_for")
                    else self.sizing.withheld_blocks)
        self.layout.update(
            adapter=self.adapter.name, physical_blocks=self.physical, num_blocks=usable,
            withheld_blocks=withheld, expected_withheld=expected,
            page_bytes=self.page, slot_bytes=self.sizing.spec.slot_bytes, num_slots=self.sizing.num_slots,
            image_bytes=self.sizing.spec.image_bytes, k=self.k, image_groups=self.image_gids,
            groups=[list(g.layer_names) for g in groups], block_size=self.block_size,
            tensor_bytes=sum(int(t.size) for t in cfg.kv_cache_tensors),
            async_scheduling=bool(self.vllm_config.scheduler_config.async_scheduling), fault=self.fault)
        if withheld != expected:
            raise RuntimeError(f"patchkit_standin StateExecutor: vLLM's pool has {usable} of {self.physical} blocks, "
                               f"the adapter withholds {expected}: the KV-config hook did not size "
                               "the pool (is it applied?)")
        if len(self.image_gids) != self.k:
            raise RuntimeError(f"patchkit_standin StateExecutor: {len(self.image_gids)} image groups, k={self.k}")
        self.buffer = torch.zeros(self.physical * self.page, dtype=torch.uint8)
        self.copier = self.adapter.make_copier(self.buffer, self.sizing, self.physical)
        if sum(seg.nbytes for seg in self.sizing.spec.image_segments()) < DIGEST_BYTES + 8:
            raise RuntimeError("the adapter's image is too small for the digest")
        self.flush(force=True)

    def compile_or_warm_up_model(self):
        return None

    def get_supported_tasks(self):
        return ("generate",)

    def update_max_model_len(self, max_model_len):
        self.layout["max_model_len"] = int(max_model_len)

    # -- the slot --------------------------------------------------------------------------------------
    def _image_ranges(self, slot: int) -> list[tuple[int, int]]:
        """The slot's bytes an image carries: the adapter's image segments, in order."""
        base = self.sizing.slot_offset(self.physical, slot)
        return [(base + seg.offset, base + seg.offset + seg.nbytes) for seg in self.sizing.spec.image_segments()]

    def _image_of(self, digest: bytes, computed: int) -> bytes:
        """The whole image a state makes: the digest and the token count, then bytes derived from both, so every
        byte of every one of the k image blocks is checked on a restore, not only the head."""
        head = digest + int(computed).to_bytes(8, "little")
        total = sum(b - a for a, b in self._image_ranges(0))
        return head + hashlib.shake_256(head).digest(total - len(head))

    def _write_slot(self, r: ReqState) -> None:
        import torch

        image, at = self._image_of(r.digest, r.computed), 0
        for a, b in self._image_ranges(r.slot):
            self.buffer[a:b] = torch.frombuffer(bytearray(image[at:at + b - a]), dtype=torch.uint8)
            at += b - a

    def _read_slot(self, slot: int) -> tuple[bytes, int, bool]:
        """The digest and token count in the slot, and whether the rest of its image is the one they make."""
        raw = b"".join(self.buffer[a:b].numpy().tobytes() for a, b in self._image_ranges(slot))
        digest, computed = raw[:DIGEST_BYTES], int.from_bytes(raw[DIGEST_BYTES:DIGEST_BYTES + 8], "little")
        return digest, computed, raw == self._image_of(digest, computed)

    def _image_blocks(self, r: ReqState, index: int) -> Optional[list[int]]:
        out = []
        for gid in self.image_gids:
            table = r.block_ids[gid] if gid < len(r.block_ids) else []
            if index >= len(table) or table[index] == 0:  # 0: vLLM's null block
                return None
            out.append(int(table[index]))
        return out

    def _take_slot(self, rid: str, r: ReqState) -> None:
        if r.slot is None:
            if not self.free_slots:
                self.counts["slot_overflow"] += 1
                return
            r.slot = self.free_slots.pop()

    def _release(self, rid: str, forget: bool) -> None:
        r = self.requests.get(rid)
        if r is None:
            return
        if r.slot is not None:
            self.free_slots.append(r.slot)
            r.slot = None
        if forget:
            del self.requests[rid]

    def _begin(self, rid: str, r: ReqState, hit: int, resumed: bool) -> None:
        """A request (re)starts at ``hit`` computed tokens: empty state, or restored from its image blocks."""
        self._take_slot(rid, r)
        r.computed, r.digest = 0, EMPTY_DIGEST
        if hit <= 0:
            return
        self.counts["prefix_hits"] += 1
        if resumed:
            self.counts["restores_on_resume"] += 1
        expected = chain(EMPTY_DIGEST, r.tokens[:hit])
        blocks = self._image_blocks(r, hit // self.block_size - 1) if hit % self.block_size == 0 else None
        if blocks is None or r.slot is None:
            self.counts["restores_missing_block"] += 1
            self.counts["restores_wrong"] += 1
            self._note_wrong(rid, hit, "no image block at the hit boundary" if r.slot is not None else "no slot")
            r.computed, r.digest = hit, expected  # recompute (what a model without the image would do)
            return
        self.copier.restore(blocks, r.slot)
        digest, computed, whole = self._read_slot(r.slot)
        right = digest == expected and computed == hit and whole
        if len(self.hits) < 64:
            self.hits.append([hit, right])
        if right:
            self.counts["restores_right"] += 1
        else:
            self.counts["restores_wrong"] += 1
            why = (f"restored state of {computed} tokens differs from the prompt's" if whole else
                   "the image's bytes past its head are not the ones its state makes (a block moved wrong)")
            self._note_wrong(rid, hit, why, blocks)
        r.computed, r.digest = hit, digest  # the scheduler's count; the state as restored, right or wrong

    def _note_wrong(self, rid, hit, why, blocks=None):
        if len(self.wrong) < 20:
            self.wrong.append({"request": rid, "hit": hit, "why": why, "blocks": blocks})

    # -- the slot allocator's events ------------------------------------------------------------------
    def on_slot_events(self, finished, preempted, resumed) -> None:
        """A listener of ``SLOT_EVENTS`` (adapters/slot_events.py), as a plugin's slot allocator is: a finished
        request's slot goes back and the request is forgotten; a preempted one's slot goes back (it resumes
        later); a resumed one gives back any slot it still holds and is re-seated by ``_begin``."""
        self.counts["slot_event_steps"] += 1
        for rid in finished:
            self._release(rid, forget=True)
        for rid in preempted:
            self._release(rid, forget=False)
            self.counts["preempted"] += 1
        for rid in resumed:
            self._release(rid, forget=False)

    def _hook_applied(self) -> bool:
        """Whether the patch image-slot-events is applied in this process (a vLLM model runner here calls the
        listeners from its ``_update_states``). In the stand-in's serve it is not: the patch is a worker patch on
        ``GPUModelRunner._update_states``, and this executor replaces the worker and its runner in EngineCore's
        process, so no ``_update_states`` runs; the executor then delivers the ids itself, from the
        ``SchedulerOutput`` vLLM's runner would have received, through the same registration point."""
        if self._hooked is None:
            from vllm_patchkit.runtime import state as runtime

            loader = runtime.current()
            rec = loader.records.get(SLOT_EVENTS_PATCH) if loader is not None else None
            self._hooked = rec is not None and rec.state == "applied"
            self.layout["slot_events"] = "image-slot-events hook" if self._hooked else "executor (no model runner)"
        return self._hooked

    # -- steps ---------------------------------------------------------------------------------------
    def execute_model(self, scheduler_output):
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        so = scheduler_output
        with self._lock:
            for copy in (getattr(so, "kv_cache_block_copies", None) or ()):  # vLLM's copy-on-write, before the step
                src, dst = int(copy.src_block_id) * self.page, int(copy.dst_block_id) * self.page
                self.buffer[dst:dst + self.page] = self.buffer[src:src + self.page]
                self.counts["block_copies"] += 1
            if not self._hook_applied():
                # The runner's place: the step's finished / preempted / resumed ids go through the registration
                # point, to on_slot_events (see _hook_applied for why the executor delivers them itself).
                events = (so.finished_req_ids, so.preempted_req_ids or (), so.scheduled_cached_reqs.resumed_req_ids)
                if any(events):  # as the patch delivers: steps with an event only
                    self.counts["slot_events_by_executor"] += 1
                    SLOT_EVENTS.deliver(*events)
            for new in so.scheduled_new_reqs:
                prompt = list(new.prompt_token_ids or [])
                r = ReqState(tokens=prompt, prompt_len=len(prompt), block_ids=[list(b) for b in new.block_ids])
                self.requests[new.req_id] = r
                self.counts["requests"] += 1
                self._begin(new.req_id, r, int(new.num_computed_tokens), resumed=False)
            cached = so.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                r = self.requests.get(rid)
                if r is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if rid in cached.resumed_req_ids:
                    r.block_ids = [list(b) for b in (new_ids or ())]
                    known = cached.all_token_ids.get(rid) if cached.all_token_ids else None
                    if known:
                        r.tokens = list(known)
                    del r.tokens[r.prompt_len + int(cached.num_output_tokens[i]):]
                    self._begin(rid, r, int(cached.num_computed_tokens[i]), resumed=True)
                elif new_ids is not None:
                    for table, ids in zip(r.block_ids, new_ids):
                        table.extend(ids)
            if so.total_num_scheduled_tokens == 0:
                self.flush()
                return EMPTY_MODEL_RUNNER_OUTPUT
            ids, sampled = [], []
            for rid, n in so.num_scheduled_tokens.items():
                ids.append(rid)
                r = self.requests.get(rid)
                if r is None:
                    sampled.append([])
                    continue
                end = r.computed + int(n)
                if end > len(r.tokens):
                    self.counts["token_gaps"] += 1
                r.digest = chain(r.digest, r.tokens[r.computed:end])
                r.computed = end
                self._store(r, end)
                if end >= len(r.tokens):  # the step reached the last known token: it samples the next one
                    tok = FIRST_TOKEN + int.from_bytes(r.digest[:4], "little") % (self.vocab - FIRST_TOKEN)
                    r.tokens.append(tok)
                    sampled.append([tok])
                    self.counts["tokens_sampled"] += 1
                else:
                    sampled.append([])
            self.counts["steps"] += 1
            self.pending_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                    sampled_token_ids=sampled)
            self.flush()
        if self.delay:
            time.sleep(self.delay)
        return None  # sample_tokens returns it, as vLLM's workers do

    def _store(self, r: ReqState, end: int) -> None:
        """The slot after ``end`` tokens into the block holding the running state, in every image group."""
        if r.slot is None:
            return
        self._write_slot(r)
        index = math.ceil(end / self.block_size) - 1 - (1 if self.fault == "store_behind" else 0)
        blocks = self._image_blocks(r, index) if index >= 0 else None
        if blocks is None:
            return
        self.copier.store(r.slot, blocks)
        self.counts["stores"] += 1
        if end % self.block_size == 0:
            self.counts["stores_at_boundary"] += 1

    def sample_tokens(self, grammar_output):
        out, self.pending_output = self.pending_output, None
        return out

    def take_draft_token_ids(self):
        return None

    # -- records ---------------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"pid": os.getpid(), "updated": time.time(), "counts": dict(self.counts), "layout": dict(self.layout),
                "wrong": list(self.wrong), "hits": list(self.hits), "running": len(self.requests), "free_slots": len(self.free_slots)}

    def publish(self) -> None:
        """The counts into this process's record (vllm_patchkit.runtime.state.count), as deltas since the last time:
        `vllm-patchkit status`, its JSON and /metrics show them next to the patches' counters."""
        from vllm_patchkit.runtime import state as runtime

        with self._publish_lock:  # its own lock: flush() may run under self._lock, from two threads
            now = dict(self.counts)  # a dict copy is atomic here
            for name, n in now.items():
                delta = n - self._published.get(name, 0)
                if delta or name not in self._published:
                    runtime.count(COUNTER_SOURCE, name, delta)
            self._published = now

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_flush < FLUSH_EVERY_S:
            return
        self._last_flush = now
        self.publish()
        try:
            from vllm_patchkit.runtime.record import write_atomic

            write_atomic(Path(self.path), self.snapshot())
        except Exception as exc:  # never fatal
            logger.warning("patchkit_standin: cannot write %s: %s", self.path, exc)

    def flush_loop(self) -> None:
        written = None
        while True:
            time.sleep(FLUSH_EVERY_S)
            with self._lock:
                now = dict(self.counts)
            if now != written:
                self.flush(force=True)
                written = now

    def shutdown(self):
        self.flush(force=True)


class StateExecutor(Executor):
    """vLLM's Executor with the stand-in worker in EngineCore's process (see the module docstring)."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        if os.environ.get(ASYNC_ENV) == "1":
            # The CPU platform turned async scheduling off in the front end; EngineCore reads it after this.
            self.vllm_config.scheduler_config.async_scheduling = True
        self.worker = StandinWorker(self.vllm_config)
        # EngineCore leaves through os._exit (atexit does not run there; multiprocessing finalizers do), and the
        # API server may kill it at shutdown: a daemon thread keeps the side file at most FLUSH_EVERY_S stale.
        atexit.register(self.worker.flush, True)
        multiprocessing.util.Finalize(None, self.worker.flush, args=(True,), exitpriority=100)
        threading.Thread(target=self.worker.flush_loop, name="patchkit-standin-flush", daemon=True).start()
        logger.info("patchkit_standin: StateExecutor for %s (k=%d, page %d B, %d physical blocks, async %s)",
                    self.worker.adapter.name, self.worker.k, self.worker.page, self.worker.physical,
                    self.vllm_config.scheduler_config.async_scheduling)

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        kwargs = kwargs or {}
        try:
            if callable(method):
                result = method(self.worker, *args, **kwargs)
            else:
                fn = getattr(self.worker, method, None)
                if fn is None:
                    logger.info("patchkit_standin: StateExecutor ignores rpc %s", method)
                    result = None
                else:
                    result = fn(*args, **kwargs)
        except Exception as exc:
            if not non_block:
                raise
            future = Future()
            future.set_exception(exc)
            return future
        if non_block:
            future = Future()
            future.set_result([result])
            return future
        return [result]

    def _single(self, method, args, non_block):
        if not non_block:
            return self.collective_rpc(method, args=args)[0]
        future = Future()
        try:
            future.set_result(getattr(self.worker, method)(*args))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def execute_model(self, scheduler_output, non_block=False):
        return self._single("execute_model", (scheduler_output,), non_block)

    def sample_tokens(self, grammar_output, non_block=False):
        return self._single("sample_tokens", (grammar_output,), non_block)

    def take_draft_token_ids(self):
        return None

    def compile_or_warm_up_model(self) -> None:
        return None

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.shutdown()
