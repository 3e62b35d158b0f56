"""Implementation modules read statically (`impl_static.py`): `check` and `pin` never import them.

The fixture implementation modules start with `import os; os.abort()`. Read from their source they give their
signatures and `super()` calls; imported they would kill the process. The end-to-end test runs `pin` and
`check` in a child process and asserts it exits normally.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from vllm_patchkit.upstream import impl_static
from vllm_patchkit.upstream.convention import problems_for
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.declaration.validation import validate

from .helpers import patch_doc, write_patches, write_tree

ABORT = "import os\nos.abort()\n"


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A package `abortpkg` whose every module (the package's __init__ too) aborts when imported."""
    root = tmp_path / "impls"
    write_tree(root, {
        "abortpkg/__init__.py": ABORT,
        "abortpkg/sub/__init__.py": ABORT,
        "abortpkg/sub/impl.py": ABORT + textwrap.dedent("""
            from .mixins import Mixin
            from vllm.v1.core.sched.scheduler import Scheduler

            def wrapper(wrapped, instance, args, kwargs, ctx=None):
                return wrapped(*args, **kwargs)

            def replacement(self, num_blocks, *, flag=(1, 2)):
                ...

            alias = wrapper
            NOT_CALLABLE = 3

            class MySched(Mixin, Scheduler):
                def schedule(self, *args, **kwargs):
                    return super().schedule(*args, **kwargs)

                @classmethod
                def make(cls, a, b=None):
                    ...
        """),
        "abortpkg/sub/mixins.py": ABORT + textwrap.dedent("""
            class Mixin:
                def finish_requests(self, request_ids, finished_status):
                    def inner():
                        return super().other()
                    return super(Mixin, self).finish_requests(request_ids, finished_status)
        """),
        "abortpkg/sub/broken.py": "def f(:\n",
    })
    # the package's __init__ files contain an abort: an accidental import would show as a dead process
    for f in (root / "abortpkg").rglob("__init__.py"):
        f.write_text(ABORT)
    monkeypatch.syspath_prepend(str(root))
    yield "abortpkg.sub"
    assert "abortpkg" not in sys.modules


def test_signatures_and_super_calls_from_the_source(pkg):
    d = impl_static.read(f"{pkg}.impl:wrapper")
    assert (d.kind, str(d.signature)) == ("function", "(wrapped, instance, args, kwargs, ctx=None)")
    assert str(impl_static.read(f"{pkg}.impl:alias").signature) == "(wrapped, instance, args, kwargs, ctx=None)"
    assert str(impl_static.read(f"{pkg}.impl:replacement").signature) == "(self, num_blocks, *, flag=(1, 2))"
    cls = impl_static.read(f"{pkg}.impl:MySched")
    assert cls.kind == "class" and cls.bases == ("Mixin", "Scheduler")
    own = impl_static.override(f"{pkg}.impl:MySched", "schedule")
    assert own.spec == f"{pkg}.impl:MySched.schedule" and own.calls_super("schedule")
    mixin = impl_static.override(f"{pkg}.impl:MySched", "finish_requests")  # from the plugin's own mixin
    assert mixin.spec == f"{pkg}.mixins:Mixin.finish_requests" and mixin.super_calls() == {"finish_requests"}
    assert impl_static.override(f"{pkg}.impl:MySched", "update_from_output") is None  # vLLM's: not read
    make = impl_static.read(f"{pkg}.impl:MySched.make")
    assert make.kind == "classmethod" and str(impl_static.call_signature(make)) == "(a, b=None)"
    assert impl_static.read(f"{pkg}.impl:NOT_CALLABLE").callable is False


@pytest.mark.parametrize("spec, words", [
    ("abortpkg.sub.impl:nope", "defines no 'nope'"),
    ("abortpkg.sub.broken:f", "implementation module abortpkg.sub.broken cannot be read: SyntaxError"),
    ("abortpkg.gone:f", "implementation module abortpkg.gone cannot be read: no module named 'abortpkg.gone'"),
    ("nowhere_at_all.x:f", "no module named 'nowhere_at_all'"),
])
def test_what_cannot_be_read_is_said_never_raised_past_the_reader(pkg, spec, words):
    with pytest.raises(impl_static.ImplUnreadable) as exc:
        impl_static.read(spec)
    assert words in str(exc.value)


def _wrap(impl: str, **extra) -> Patch:
    return validate(Patch, patch_doc("p", "toy.mod:g", implementation=impl, **extra))


def test_problems_for_reads_the_implementation_statically(pkg):
    assert problems_for(_wrap(f"{pkg}.impl:wrapper", params=["b"]), "(a, b=1)", target_kind="function") == []
    [p] = problems_for(_wrap(f"{pkg}.impl:wrapper", params=["c"]), "(a, b=1)", target_kind="function")
    assert (p.code, p.where) == ("unknown_param", "c")
    [p] = problems_for(_wrap(f"{pkg}.broken:f"), "(a, b=1)")
    assert p.code == "implementation" and "cannot be read: SyntaxError" in p.reason
    [p] = problems_for(_wrap(f"{pkg}.impl:NOT_CALLABLE"), "(a, b=1)")
    assert p.code == "implementation" and "not callable" in p.reason
    [p] = problems_for(_wrap("not_installed_here.mod:f"), "(a, b=1)")
    assert p.code == "implementation_missing"


CHILD = """
import sys
from vllm_patchkit.tools.cli import main
rc_pin = main(["pin", "--source", sys.argv[1], "--vllm", "1.0.0", "--patch-dir", sys.argv[2],
               "--manifest-dir", sys.argv[3]])
rc_check = main(["check", "--source", sys.argv[1], "--vllm", "1.0.0", "--patch-dir", sys.argv[2],
                 "--manifest-dir", sys.argv[3]])
print("RESULT", rc_pin, rc_check, "abortpkg" in sys.modules)
"""


def test_check_and_pin_never_import_an_implementation_module(pkg, tmp_path):
    """pin and check of a set whose implementations abort on import: both read the signatures and report (a
    declared parameter the target lacks is a convention finding), in a child process that exits normally."""
    # the toy release also defines the Scheduler the implementation module imports: its reach (issue 30) is met
    tree = write_tree(tmp_path / "tree", {"toy/mod.py": "def g(a, b=1):\n    pass\n\ndef h(a):\n    pass\n",
                                          "vllm/__init__.py": "", "vllm/v1/__init__.py": "",
                                          "vllm/v1/core/__init__.py": "", "vllm/v1/core/sched/__init__.py": "",
                                          "vllm/v1/core/sched/scheduler.py": "class Scheduler:\n    pass\n"})
    patches = write_patches(tmp_path / "patches", [
        patch_doc("fits", "toy.mod:g", implementation=f"{pkg}.impl:wrapper", params=["b"]),
        patch_doc("misfit", "toy.mod:h", implementation=f"{pkg}.impl:wrapper", params=["nope"]),
    ])
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "impls"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(patches), str(manifests)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert "RESULT 0 0 False" in run.stdout, run.stdout
    written = yaml.safe_load((manifests / "vllm-1.0.0.yaml").read_text())
    assert [e["patch"] for e in written["patches"]] == ["fits@1"]
    [na] = written["not_applicable"]  # misfit: not applicable, with the convention reason
    assert na["patch"] == "misfit"
    assert "declares parameter 'nope' in `params`, but the target's signature (a) has no such parameter" in na["reason"]
