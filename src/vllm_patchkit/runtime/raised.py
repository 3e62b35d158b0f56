"""Exceptions out of an installed function: counted on the exception path only, the patch's own told apart from
vLLM's passing through.

Why: a wrapper counted calls, not failures, so a required wrap whose implementation raised on every call read
`applied` while every request failed. Every closure of wrappers.py has a `try`/`except` around its one call
(free on success since Python 3.11: no instruction runs unless something raises) that hands the exception
here. An exception is the patch's own (`raised`) unless it came out of vLLM's code the implementation called
through `wrapped` (`passed`): then a frame of the original's code is on its traceback, which is read only now,
on the exception path. An original with no Python frame of its own (a C function) is handed to the
implementation behind a one-line Python shim (`through`), so its frame can be recognised too.

What is kept: the counts, and per distinct (type, first line, place) at most MAX_KINDS entries of strings
only (never the exception, which would keep its frames and their locals alive). The first time a patch
raises a new kind of exception, `ALERT` (the process's loader's flush, set by the plugin) writes the record
at once, so a process killed right after still names it.
"""

from __future__ import annotations

import time
import types
from typing import Any, Callable, Optional

#: Distinct exceptions kept per patch per process (the count goes on beyond it, in `raised`/`passed`).
MAX_KINDS = 8
MAX_MESSAGE = 300
#: Called (no arguments) when a patch raises an exception of a kind not seen before in this process.
ALERT: Optional[Callable[[], Any]] = None


def codes_of(original: Any) -> tuple:
    """The code objects a call of `original` runs first (its own frame on a traceback): () when it has none."""
    seen = 0
    while seen < 8:
        seen += 1
        if isinstance(original, types.FunctionType):
            return (original.__code__,)
        if isinstance(original, types.MethodType):
            original = original.__func__
            continue
        inner = getattr(original, "func", None)  # functools.partial
        if inner is not None and callable(inner):
            original = inner
            continue
        call = getattr(type(original), "__call__", None)
        if isinstance(call, types.FunctionType):  # a callable object written in Python
            return (call.__code__,)
        return ()
    return ()


def through(original: Callable) -> tuple[Callable, tuple]:
    """What the implementation is handed as the original, and the codes that mark a pass-through.

    A Python function is handed as it is; anything with no Python frame of its own behind a shim whose frame
    marks the call (one extra call for such rare originals only)."""
    codes = codes_of(original)
    if codes:
        return original, codes

    def call_through(*args, **kwargs):
        return original(*args, **kwargs)

    return call_through, (call_through.__code__,)


def _where(tb: Any) -> str:
    code = tb.tb_frame.f_code
    return f"{code.co_filename}:{tb.tb_lineno}"


def note(counter: Any, exc: BaseException, codes: Optional[tuple], own: Optional[tuple] = None) -> None:
    """Count `exc` (propagating out of an installed function) on `counter`: passed through vLLM's original
    (a frame of `codes` on its traceback; `codes` None: the function is vLLM's own passthrough), or the
    patch's. `own`: the implementation's code, whose file the place is reported in. Never raises.
    StopIteration / StopAsyncIteration end an iteration (a `__next__` replaced): control flow, not failures."""
    if isinstance(exc, (StopIteration, StopAsyncIteration)):
        return
    try:
        tb = exc.__traceback__
        passed = codes is None
        frames = []
        while tb is not None:
            if not passed and tb.tb_frame.f_code in codes:
                passed = True
            frames.append(tb)
            tb = tb.tb_next
        if passed:
            counter.passed += 1
        else:
            counter.raised += 1
        impl_file = own[0].co_filename if own else None
        mine = [t for t in frames if t.tb_frame.f_code.co_filename == impl_file] if impl_file else []
        at = _where(mine[-1]) if mine else (_where(frames[-1]) if len(frames) > 1 else "?")
        origin = _where(frames[-1]) if frames else "?"
        text = str(exc)
        first = text.splitlines()[0][:MAX_MESSAGE] if text else ""
        key = (type(exc).__qualname__, first, at, passed)
        kinds = counter.kinds
        entry = kinds.get(key)
        now = time.time()
        if entry is None:
            if len(kinds) >= MAX_KINDS:
                return
            kinds[key] = entry = {"type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
                                  "message": first, "at": at, "passed_through": passed, "count": 0, "first": now}
            if origin != at:
                entry["raised_in"] = origin
            alert = ALERT if not passed else None
        else:
            alert = None
        entry["count"] += 1
        entry["last"] = now
        if alert is not None:
            alert()
    except Exception:  # noqa: BLE001 - counting must never replace the exception vLLM is about to see
        pass


def publish(counter: Any, record: Any) -> None:
    """Copy the counts into a PatchRecord (the loader's sync at every flush)."""
    record.raised, record.passed_through = counter.raised, counter.passed
    if counter.kinds:
        record.exceptions = [dict(e) for e in list(counter.kinds.values())]
