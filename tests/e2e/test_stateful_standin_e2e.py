"""A stand-in with state, served: the plugin's shape in a real ``vllm.entrypoints.openai.api_server`` on the CPU.

What runs real: the API server, EngineCore, vLLM's KV sizing (through the KV-config hook, with the real
``DeepseekV4Adapter`` pricing a V4-shaped config.json), vLLM's ``AsyncScheduler`` and batch queue, its
``KVCacheManager`` with one proxy attention group and ``k`` ``MambaSpec`` align image groups, the prefix cache,
and the image-publish patches on them. What stands in: the worker and model, as a vLLM ``Executor``
(``patchkit_standin.state_executor.StateExecutor``, given as ``--distributed-executor-backend``) that keeps a
state slot per request holding a digest of the tokens it computed, stores it into the image group's running
block at every step's end with the adapter's copier, and on a prefix hit restores the slot from the image
blocks and compares it with the digest recomputed from the prompt (docs/adapters/stateful-standin.md).

Shown: the hook's decision is ``sized`` with its numbers; >= 50 prefix-hit restores, none wrong; an abort storm
(32 streams cancelled around a decode keep) leaves EngineCore healthy and a new request answered; the
image-publish record counts published / deferred / dropped. A negative control (the executor storing one block
too early) makes every restore wrong; a pool too small for the batch makes vLLM preempt, and the preempted
requests resume from their own images with the right state.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.stateful_standin import EXECUTOR, build_v4_checkpoint, side_records, stream_and_cancel
from vllm_patchkit.tools.serve.server import pid_alive, serve
from vllm_patchkit.reporting.run_folder import load_run


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not _installed("vllm"), reason="vLLM is not installed"),
    pytest.mark.skipif(not _installed("patchkit_standin.state_executor"),
                       reason="pip install ./tests/plugins/standin (0.2.0: the stand-in executor)"),
]

BLOCK = 128
INTERVAL = 256
PHYSICAL = 2048
SLOTS = 32
VOCAB_LO, VOCAB_HI = 3, 500  # the tiny tokenizer's ordinary tokens
HITS = 60
STORM = 32
STORM_PROMPT = 250  # anchor 128; the decode keep at 384 (one interval past it) is the 134th generated token
STORM_CHUNKS = 131  # each stream is cut after 131..137 chunks: around that keep


def _tokens(rng, n):
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


def _rec(proc, pid):
    return next(r for r in proc["patches"] if r["patch"].split("@")[0] == pid)


def _engine(run):
    (ec,) = [p for p in run.processes if p["role"] == "engine_core"]
    return ec


def _adapter_withheld(checkpoint, slots, physical):
    """The real DeepSeek-V4 adapter's withheld blocks for this checkpoint, `slots` slots, `physical` blocks."""
    from types import SimpleNamespace as NS

    from patchkit_deepseek_v4.adapters import DeepseekV4Adapter

    hf = json.loads((checkpoint / "config.json").read_text())
    config = NS(model_config=NS(hf_config=hf), cache_config=NS(cache_dtype="auto"), speculative_config=None,
                scheduler_config=NS(max_num_seqs=slots))
    sizing = DeepseekV4Adapter().sizing(config)
    return sizing.withheld_for(physical) if hasattr(sizing, "withheld_for") else sizing.withheld_blocks


@pytest.fixture(scope="module")
def v4_checkpoint(tmp_path_factory):
    return build_v4_checkpoint(tmp_path_factory.mktemp("stateful-v4"))


@contextlib.contextmanager
def _serve(checkpoint, tmp_path, slots=SLOTS, **extra_env):
    """The stand-in executor behind a real API server (async scheduling, prefix caching, Mamba align groups)."""
    status_dir = tmp_path / "status"
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "PATCHKIT_STANDIN": "1", "PATCHKIT_STANDIN_ASYNC": "1",
           "PATCHKIT_STANDIN_KV_BLOCKS": str(PHYSICAL), "PATCHKIT_STANDIN_STEP_DELAY_S": "0.02",
           "VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS": str(INTERVAL), "VLLM_PATCHKIT_FLUSH_SECONDS": "0.5", **extra_env}
    args = ["--distributed-executor-backend", EXECUTOR, "--enable-prefix-caching", "--mamba-cache-mode", "align",
            "--block-size", str(BLOCK), "--max-model-len", "1024", "--max-num-seqs", str(slots)]
    with serve(checkpoint, env=env, extra_args=args, log_path=tmp_path / "server.log") as srv:
        yield srv, status_dir
        time.sleep(2.0)  # the last periodic flushes (vLLM's API server force-kills EngineCore on stop)


def _hits(srv, rng, n):
    """One prompt files its images (rungs at 256 and 512; its anchor at 512 is the same boundary); then `n`
    prompts sharing 260..600 of its tokens, each with its own tail, hit 256 or 512."""
    base = _tokens(rng, 600)
    assert srv.complete_tokens(base, max_tokens=2)["usage"]["completion_tokens"] == 2
    prompts = [base[:260 + (i * 23) % 340] + _tokens(rng, 5 + i % 7) for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda p: srv.complete_tokens(p, max_tokens=3), prompts))
    assert all(o["usage"]["completion_tokens"] == 3 for o in outs)


def _read(status_dir):
    run = load_run(status_dir)
    assert run is not None, "no records"
    ec = _engine(run)
    assert ec.get("error") in (None, ""), ec.get("error")
    (side,) = side_records(status_dir, run.run_id)
    return ec, side


def test_stateful_standin_restores_right_and_survives_an_abort_storm(v4_checkpoint, tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    rng = random.Random(14)
    with _serve(v4_checkpoint, tmp_path) as (srv, status_dir):
        # 1. Prefix hits: each restores its slot from the image blocks at 256 or 512.
        _hits(srv, rng, HITS)

        # 2. The abort storm: 32 streams, each cancelled after 131..137 chunks, around the decode keep at 384.
        storm = [(_tokens(rng, STORM_PROMPT), STORM_CHUNKS + i % 7) for i in range(STORM)]
        with ThreadPoolExecutor(STORM) as pool:
            seen = list(pool.map(lambda pc: stream_and_cancel(srv.base_url, srv.model, pc[0], 200, pc[1]), storm))
        assert seen == [c for _, c in storm]  # every stream was cut by its client, none finished
        time.sleep(1.0)  # the aborts reach EngineCore
        assert srv.get("/health") is None  # 200, empty body
        after = srv.complete_tokens(_tokens(rng, 40), max_tokens=8)
        assert after["usage"]["completion_tokens"] == 8
        engine_pids = [pid for pid, title in srv.processes().items() if "EngineCor" in title]
        assert engine_pids and all(pid_alive(p) for p in engine_pids)

    ec, side = _read(status_dir)

    # The KV-config hook sized the pool with the real V4 adapter's numbers (TINY, bf16: page 10,752 B,
    # slot 98,304 B, k = 3) and withheld the 32 slots (the contiguous lower bound is
    # ceil(32 * 98,304 / 10,752) = 293 blocks; the adapter's own count for 2,048 physical blocks is checked).
    withheld = _adapter_withheld(v4_checkpoint, SLOTS, PHYSICAL)
    assert withheld >= 293
    hook = _rec(ec, "kv-config-hook")
    assert hook["state"] == "applied" and hook["detail"]["decisions"] == {"sized": 1}, hook["detail"]
    plan = hook["detail"]["last_call"]["plan"]
    assert (plan["adapter"], plan["block_size"], plan["page_bytes"], plan["slot_bytes"], plan["k"]) == \
        ("DeepSeek-V4", BLOCK, 10_752, 98_304, 3)
    assert (plan["physical"], plan["num_slots"], plan["withheld"], plan["usable"], plan["image_groups"]) == \
        (PHYSICAL, SLOTS, withheld, PHYSICAL - withheld, 3)
    assert plan["interval_tokens"] == INTERVAL and plan["publishes"]

    # The stand-in worker: every prefix hit restored the state the prompt gives, from the image blocks.
    counts, layout = ec["counters"]["patchkit_standin.state_executor"], side["layout"]
    assert counts == side["counts"]  # the record (runtime.count) and the executor's own file agree
    assert layout["async_scheduling"] is True and layout["num_blocks"] == PHYSICAL - withheld
    assert layout["image_groups"] == [1, 2, 3] and layout["withheld_blocks"] == withheld
    assert counts["restores_wrong"] == 0, side["wrong"]
    assert counts["restores_right"] >= 50, counts
    assert counts["stores"] > counts["stores_at_boundary"] > 0 and counts["token_gaps"] == 0, counts
    assert counts["slot_overflow"] == 0 and counts["restores_missing_block"] == 0, counts

    # The image book: images published, decode keeps deferred (async), and its drop counters in the record.
    book = _rec(ec, "image-publish")["detail"]
    assert book["layout"]["image_groups"] == [1, 2, 3] and book["layout"]["interval_tokens"] == INTERVAL
    assert book["published"] >= 2 and book["deferred"] >= 1, book
    assert book["filed"]["keep"] >= 1 and book["filed"]["rung"] >= 2, book
    for name in ("dropped_on_abort", "dropped_on_preemption"):
        assert name in book, book
    finish = _rec(ec, "image-publish-finish")["detail"]
    split = _rec(ec, "image-publish-split")["detail"]
    assert split.get("chunks_cut_for_rung", 0) >= 1, split
    print("\nkv-config-hook plan:", json.dumps(plan, sort_keys=True))
    print("stand-in executor:", json.dumps(counts, sort_keys=True))
    print("image-publish:", json.dumps({k: v for k, v in book.items() if k not in ("places", "layout")},
                                       sort_keys=True))
    print("image-publish-finish:", json.dumps({k: v for k, v in finish.items() if k != "places"}, sort_keys=True))


def test_negative_control_a_store_into_the_wrong_block_restores_wrong(v4_checkpoint, tmp_path, monkeypatch):
    """The same hits with the executor storing each state one block before the running state's block: the image
    blocks the book publishes then do not hold the state at their boundary, and every restore counts wrong."""
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    with _serve(v4_checkpoint, tmp_path, PATCHKIT_STANDIN_FAULT="store_behind") as (srv, status_dir):
        _hits(srv, random.Random(15), 12)
    ec, side = _read(status_dir)
    counts = ec["counters"]["patchkit_standin.state_executor"]
    assert side["layout"]["fault"] == "store_behind"
    # every hit wrong (measured at native placement: 11 of the 12 prompts hit, 12 before; why one prompt
    # fewer hits is not analysed yet)
    assert counts["prefix_hits"] >= 10 and counts["restores_wrong"] == counts["prefix_hits"], counts
    assert counts["restores_right"] == 0, counts
    assert _rec(ec, "image-publish")["detail"]["published"] >= 2


def test_preempted_requests_resume_from_their_own_images(v4_checkpoint, tmp_path, monkeypatch):
    """A pool too small for the batch: vLLM preempts running requests (the book drops their deferred keeps);
    each resumes from the last image it published, and the restored state is the one its tokens give."""
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    rng = random.Random(16)
    # 8 slots withhold at least ceil(8 * 98,304 / 10,752) = 74 of 140 blocks; the pool left (66 or fewer) is less
    # than 8 requests of 500 + 300 tokens need (7 proxy blocks and 2..3 per image group each).
    with _serve(v4_checkpoint, tmp_path, PATCHKIT_STANDIN_KV_BLOCKS="140", PATCHKIT_STANDIN_STEP_DELAY_S="0",
                slots=8) as (srv, status_dir):
        prompts = [_tokens(rng, 500) for _ in range(16)]
        with ThreadPoolExecutor(16) as pool:
            outs = list(pool.map(lambda p: srv.complete_tokens(p, max_tokens=300, ignore_eos=True), prompts))
        assert all(o["usage"]["completion_tokens"] == 300 for o in outs)
    ec, side = _read(status_dir)
    counts = ec["counters"]["patchkit_standin.state_executor"]
    book = _rec(ec, "image-publish")["detail"]
    print("\npreemption: stand-in executor:", json.dumps(counts, sort_keys=True))
    print("preemption: image-publish:", json.dumps({k: v for k, v in book.items() if k not in ("places", "layout")},
                                                   sort_keys=True))
    assert counts["preempted"] >= 1 and counts["restores_on_resume"] >= 1, counts
    assert counts["restores_wrong"] == 0 and counts["token_gaps"] == 0, side["wrong"]
    # The slot allocator heard finish / preempt / resume at the registration point (adapters/slot_events.py).
    # No vLLM runner runs in this serve (the executor replaces the worker, in EngineCore), so the patch
    # image-slot-events, a worker patch on GPUModelRunner._update_states, is not for any process here, and the
    # executor delivered the ids itself (tests/e2e/test_batch_dispatch_e2e.py: the hook in a real worker).
    assert side["layout"]["slot_events"] == "executor (no model runner)", side["layout"]
    assert counts["slot_event_steps"] == counts["slot_events_by_executor"] >= counts["preempted"], counts
    events = _rec(ec, "image-slot-events")
    assert (events["state"], events["code"]) == ("skipped", "process"), events


# -- the native placement, served ---------------------------------------------------------------------------

def _continuation(checkpoint, tokens, n):
    """The `n` tokens the stand-in executor samples after `tokens` (its rule: a token from the digest of every
    token so far), so a later prompt can share a request's generated prefix."""
    from patchkit_standin.state_executor import EMPTY_DIGEST, FIRST_TOKEN, chain

    vocab = int(json.loads((checkpoint / "config.json").read_text())["vocab_size"])
    out, digest = list(tokens), chain(EMPTY_DIGEST, tokens)
    for _ in range(n):
        tok = FIRST_TOKEN + int.from_bytes(digest[:4], "little") % (vocab - FIRST_TOKEN)
        out.append(tok)
        digest = chain(digest, [tok])
    return out


def test_native_placement_served_decode_keep_demand_rung_aligned_anchor(v4_checkpoint, tmp_path, monkeypatch):
    """Issue 22, in a real serve (interval 384, demand on, block 128, async scheduling), one request at a time:

    * A: a 200-token prompt generating 500: its anchor at 128 and its decode keep at **512**, the first block
      boundary one interval past the anchor (the old rule kept at multiples of the interval: 384);
      B (A's first 512 tokens + its own tail) hits that keep and restores right;
    * C: A's first 640 tokens (cached as paged history up to 640, A's last image at 512) + a 300-token tail:
      vLLM's image hit is 512, its paged-history hit 640, so the **demand rung** goes at 640 (a chunk is cut
      there), then the rung at 768 and the anchor at 896; D (A's first 640 + another tail) hits C's demand image
      and restores right;
    * E: a block-aligned 640-token prompt: the rung at 384 and its **anchor at 512**, one block short of its
      end; F, the same 640 tokens again, can match at most 639 tokens: it hits that anchor (the old anchor at 640
      could never be hit) and restores right.
    """
    monkeypatch.delenv("VLLM_PATCHKIT_RUN_ID", raising=False)
    rng = random.Random(22)
    a_prompt = _tokens(rng, 200)
    a_all = _continuation(v4_checkpoint, a_prompt, 500)
    e_prompt = _tokens(rng, 640)
    with _serve(v4_checkpoint, tmp_path, VLLM_PATCHKIT_IMAGE_INTERVAL_TOKENS="384",
                VLLM_PATCHKIT_IMAGE_DEMAND="1") as (srv, status_dir):
        out = srv.complete_tokens(a_prompt, max_tokens=500, ignore_eos=True)
        assert out["usage"]["completion_tokens"] == 500
        for prompt in (a_all[:512] + _tokens(rng, 50), a_all[:640] + _tokens(rng, 300),
                       a_all[:640] + _tokens(rng, 100), e_prompt, e_prompt):
            assert srv.complete_tokens(prompt, max_tokens=2, ignore_eos=True)["usage"]["completion_tokens"] == 2
    ec, side = _read(status_dir)
    book = _rec(ec, "image-publish")["detail"]
    split = _rec(ec, "image-publish-split")["detail"]
    counts = ec["counters"]["patchkit_standin.state_executor"]
    print("\nnative placement: placed", book["placed"], "hits", side["hits"])
    print("native placement: image-publish:", json.dumps({k: v for k, v in book.items()
                                                          if k not in ("places", "layout", "placed")}, sort_keys=True))
    print("native placement: image-publish-split:", json.dumps({k: v for k, v in split.items() if k != "places"}))
    placed = [tuple(p) for p in book["placed"]]
    # A: anchor 128, keep 512; B: nothing (it starts at its hit, 512 = its anchor); C: demand 640, rung 768,
    # anchor 896; D: nothing (starts at its hit, 640 = its anchor); E: rung 384, anchor 512; F: nothing.
    assert placed == [("anchor", 128), ("keep", 512), ("demand", 640), ("rung", 768), ("anchor", 896),
                      ("rung", 384), ("anchor", 512)], placed
    assert split.get("chunks_cut_for_demand", 0) == 1, split
    # the hits: B at 512 (A's decode keep), C at 512, D at 640 (C's demand image), F at 512 (E's anchor)
    assert side["hits"] == [[512, True], [512, True], [640, True], [512, True]], side["hits"]
    assert counts["restores_wrong"] == 0 and book["published"] == len(placed), (side["wrong"], book)
