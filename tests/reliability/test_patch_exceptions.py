"""A patch that fails at run time is a state (issue 33, item 1).

A required front-end wrap whose implementation raised on every call read `applied calls=5`, `status` exit 0,
the route 200 and /metrics `state="applied"`, while every request failed. Here the wrap stands on a real vLLM
method (`SamplingParams._verify_args`, which vLLM's own `SamplingParams.__post_init__` calls on every
request's parameters) and is called through vLLM's code: its own exceptions are counted with type, first line
and the implementation's file:line, and judged; an exception vLLM's original raised through the wrapper (a
request with a negative temperature) is counted apart and is not the patch's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from vllm_patchkit.reporting import metrics, route, run_folder, status, verdict
from vllm_patchkit.tools.cli import main

from ..framework.helpers import make_loader, patch_doc, pinned_entry, write_module

TARGET = "vllm.sampling_params:SamplingParams._verify_args"

IMPLS = '''
def broken(wrapped, instance, args, kwargs, ctx):
    return wrapped(*args, **kwargs) + kwargs["missing"]  # the bug: vLLM passes no such keyword

def careful(wrapped, instance, args, kwargs, ctx):
    return wrapped(*args, **kwargs)

def converting(wrapped, instance, args, kwargs, ctx):
    try:
        return wrapped(*args, **kwargs)
    except Exception as exc:
        raise RuntimeError("converted: " + str(exc)) from exc
'''


@pytest.fixture
def sampling(tmp_path, monkeypatch):
    import vllm.sampling_params as sp

    write_module(tmp_path, "patchkit_exc_impls", IMPLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("patchkit_exc_impls", None)
    saved = sp.SamplingParams.__dict__["_verify_args"]
    yield sp
    type.__setattr__(sp.SamplingParams, "_verify_args", saved)


def _loader(tmp_path, impl: str, required: bool = True):
    doc = patch_doc(id="verify-wrap", kind="wrap", target=TARGET, implementation=f"patchkit_exc_impls:{impl}",
                    processes=["frontend"], required=required, expected_calls="per_request")
    loader = make_loader(tmp_path, {"verify-wrap": doc}, [pinned_entry("verify-wrap@1", TARGET)])
    loader.run_import_stage()
    assert loader.records["verify-wrap"].state == "applied"
    return loader


def _line_of(text: str, fragment: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if fragment in line)


def _route_status(base: Path, run_id: str) -> tuple[int, dict]:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()
    route.install(app, base, run_id, auth_cls=type("NoAuth", (), {}))
    resp = TestClient(app).get(route.ROUTE)
    return resp.status_code, resp.json()


def _metrics(base: Path, run_id: str) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    metrics.install(registry, base, run_id)
    text = generate_latest(registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_required_wrap_raising_on_every_call_is_a_problem_everywhere(tmp_path, sampling, capsys):
    loader = _loader(tmp_path, "broken")
    try:
        for _ in range(5):  # five requests' parameters, built by vLLM's own __post_init__
            with pytest.raises(KeyError, match="missing"):
                sampling.SamplingParams(temperature=0.5)
        loader.flush()
    finally:
        loader.unpatch()
    rec = loader.records["verify-wrap"]
    impl_file = str(tmp_path / "patchkit_exc_impls.py")
    line = _line_of(IMPLS, "the bug")
    at = f"{impl_file}:{line}"
    assert (rec.calls, rec.raised, rec.passed_through) == (5, 5, 0)
    [kind] = rec.exceptions
    assert (kind["type"], kind["message"], kind["at"], kind["passed_through"], kind["count"]) == \
        ("KeyError", "'missing'", at, False, 5)
    base, rid = tmp_path / "status", loader.process.run_id
    on_disk = json.loads(next(base.rglob("*.json")).read_text())
    [row] = [r for r in on_disk["patches"] if r["patch"] == "verify-wrap@1"]
    assert (row["raised"], row["exceptions"][0]["at"]) == (5, at)

    assert main(["status", "--dir", str(base)]) == 1
    table = capsys.readouterr().out
    assert "applied, RAISED" in table and "5 (5 raised)" in table
    problem = (f"verify-wrap@1 in frontend (pid {os.getpid()}): required patch: its implementation raised 5 "
               f"exception(s) in 5 call(s): KeyError: 'missing' (at {at})")
    assert verdict.assess(run_folder.load_run(base, rid)) == (1, [problem])
    code, body = _route_status(base, rid)
    assert code == 503 and body["exit_code"] == 1 and body["problems"] == [problem]
    m = _metrics(base, rid)
    labels = (("patch", "verify-wrap"), ("required", "true"), ("role", "frontend"), ("set", ""),
              ("state", "raised"), ("version", "1"))
    assert m.get(("vllm_patchkit_patch_state", labels)) == 1, [k for k in m if k[0] == "vllm_patchkit_patch_state"]
    assert m[("vllm_patchkit_patch_exceptions_total",
              (("origin", "implementation"), ("patch", "verify-wrap"), ("role", "frontend")))] == 5
    assert m[("vllm_patchkit_status_exit_code", ())] == 1


def test_vllms_own_exception_passing_through_is_not_the_patchs(tmp_path, sampling, capsys):
    loader = _loader(tmp_path, "careful")
    try:
        sampling.SamplingParams(temperature=0.5)
        from vllm.exceptions import VLLMValidationError

        with pytest.raises(VLLMValidationError, match="temperature must be non-negative"):  # vLLM's own validation
            sampling.SamplingParams(temperature=-1.0)
        loader.flush()
    finally:
        loader.unpatch()
    rec = loader.records["verify-wrap"]
    assert (rec.calls, rec.raised, rec.passed_through) == (2, 0, 1)
    [kind] = rec.exceptions
    assert kind["passed_through"] is True and kind["type"] == "vllm.exceptions.VLLMValidationError"
    assert kind["raised_in"].startswith(str(Path(sampling.__file__))), kind
    base = tmp_path / "status"
    assert main(["status", "--dir", str(base)]) == 0
    assert "RAISED" not in capsys.readouterr().out
    assert _route_status(base, loader.process.run_id)[0] == 200
    m = _metrics(base, loader.process.run_id)
    assert m[("vllm_patchkit_patch_exceptions_total",
              (("origin", "passed_through"), ("patch", "verify-wrap"), ("role", "frontend")))] == 1


def test_an_exception_the_implementation_converts_is_its_own(tmp_path, sampling):
    loader = _loader(tmp_path, "converting")
    try:
        with pytest.raises(RuntimeError, match="converted"):
            sampling.SamplingParams(temperature=-1.0)
        loader.sync_calls()
    finally:
        loader.unpatch()
    rec = loader.records["verify-wrap"]
    assert (rec.raised, rec.passed_through) == (1, 0)
    assert rec.exceptions[0]["at"].endswith(f"patchkit_exc_impls.py:{_line_of(IMPLS, 'raise RuntimeError')}")


def test_optional_patch_that_raised_is_a_warning(tmp_path, sampling):
    loader = _loader(tmp_path, "broken", required=False)
    try:
        with pytest.raises(KeyError):
            sampling.SamplingParams()
        loader.flush()
    finally:
        loader.unpatch()
    run = run_folder.load_run(tmp_path / "status", loader.process.run_id)
    assert verdict.assess(run) == (0, [])
    [w] = [w for w in verdict.warnings_of(run) if "verify-wrap@1" in w and "raised" in w]
    assert "optional patch: its implementation raised 1 exception(s) in 1 call(s): KeyError: 'missing'" in w


def test_c_function_original_passing_through(tmp_path, monkeypatch):
    """An original with no Python frame (a C function) is handed behind a shim: what it raises still passes."""
    from vllm_patchkit.runtime.wrappers import Counter, build_callable
    from vllm_patchkit.declaration.schema import Patch  # noqa: F401 - the loader's patch type

    write_module(tmp_path, "patchkit_exc_c", "def careful(wrapped, instance, args, kwargs):\n"
                                             "    return wrapped(*args, **kwargs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import patchkit_exc_c

    loader = _loader_for_build(tmp_path)
    counter = Counter()
    fn = build_callable(loader, int, patchkit_exc_c.careful, counter, True)
    assert fn("7") == 7
    with pytest.raises(ValueError):
        fn("x")
    assert (counter.calls, counter.raised, counter.passed) == (2, 0, 1)


def _loader_for_build(tmp_path):
    doc = patch_doc(id="c-wrap", kind="wrap", target=TARGET, implementation="patchkit_exc_c:careful",
                    processes=["frontend"])
    from vllm_patchkit.declaration.declare import load_patch_set
    from ..framework.helpers import write_patch

    write_patch(tmp_path / "cpatches", "c-wrap", doc)
    return load_patch_set([tmp_path / "cpatches"]).patches["c-wrap@1"]


# -- a process that dies with a patch's exception in flight ------------------------------------------------
DIES = textwrap.dedent('''
    import os, sys
    from pathlib import Path
    sys.path.insert(0, {tmp!r})
    from vllm_patchkit.declaration.declare import load_patch_set
    from vllm_patchkit.declaration.manifest import load_manifests
    from vllm_patchkit.runtime import plugin, raised, state
    from vllm_patchkit.runtime.flush import Flusher
    from vllm_patchkit.runtime.loader import Loader
    import vllm.sampling_params as sp
    ps = load_patch_set([Path({tmp!r}) / "patches"])
    loader = Loader(ps, load_manifests([Path({tmp!r}) / "manifests"], ps), role="frontend", vllm_version="0.31.0")
    state.install(loader)
    Flusher(loader, interval=3600).start()      # no periodic flush before the kill
    raised.ALERT = plugin._flush_current        # as plugin.register sets it
    loader.run_import_stage()
    try:
        sp.SamplingParams()
    finally:
        os.kill(os.getpid(), 9)                 # killed with the exception in flight: no exit flush
''')


def test_process_killed_with_a_patchs_exception_in_flight_names_it(tmp_path, sampling):
    _loader(tmp_path, "broken").unpatch()  # writes the patch set and manifest to tmp_path
    env = {**os.environ, "VLLM_PATCHKIT_STATUS_DIR": str(tmp_path / "run-status"), "VLLM_PATCHKIT_RUN_ID": "run1",
           "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run([sys.executable, "-c", DIES.format(tmp=str(tmp_path))], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    run = run_folder.load_run(tmp_path / "run-status", "run1")
    [proc] = run.processes
    [row] = [r for r in proc["patches"] if r["patch"] == "verify-wrap@1"]
    assert (row["calls"], row["raised"]) == (1, 1)
    code, problems = verdict.assess(run)
    assert code == 1
    assert any("required patch: its implementation raised 1 exception(s)" in p for p in problems), problems
    gone = [p for p in problems if p.startswith("frontend (pid")]  # how the process ended
    assert len(gone) == 1, problems
    gone = gone[0]
    assert "the last exception out of a patch: verify-wrap@1 raised KeyError: 'missing' (at " in gone, gone
    assert "patchkit_exc_impls.py:" in gone


def test_the_end_of_an_iteration_is_not_a_failure(tmp_path):
    """StopIteration out of a replaced `__next__` is how iteration ends: neither raised nor passed through."""
    from vllm_patchkit.runtime.wrappers import Counter, build_callable

    write_module(tmp_path, "patchkit_exc_c", "def careful(wrapped, instance, args, kwargs):\n"
                                             "    return wrapped(*args, **kwargs)\n")
    counter = Counter()
    fn = build_callable(_loader_for_build(tmp_path), next, lambda w, i, a, k: w(*a, **k), counter, True)
    with pytest.raises(StopIteration):
        fn(iter(()))
    assert (counter.calls, counter.raised, counter.passed) == (1, 0, 0)
