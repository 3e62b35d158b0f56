"""A real CPU serve with a required front-end wrap whose implementation raises on every request (issue 33,
item 1): every completion fails, and now the route answers 503, `/metrics` says `state="raised"` and
`vllm-patchkit status` exits 1 with the row naming the exception (before: 200, `applied`, exit 0).

The wrap stands on vLLM's `SamplingParams._verify_args`, which the API server runs for each request's
parameters; its set is passed with VLLM_PATCHKIT_EXTRA_PATCHES like any third party's folder.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
import vllm
import yaml

from vllm_patchkit.tools.cli import main as cli_main
from vllm_patchkit.tools.serve.server import RequestError, serve

from tests.framework.helpers import live_pin, patch_doc

pytestmark = pytest.mark.e2e

TARGET = "vllm.sampling_params:SamplingParams._verify_args"
IMPL = ("def verify(wrapped, instance, args, kwargs, ctx):\n"
        "    wrapped(*args, **kwargs)\n"
        "    raise KeyError('request_budget')  # the bug: on every call\n")


def test_required_frontend_wrap_raising_is_503_and_status_1(tiny_model, tmp_path, capsys):
    folder, code_dir = tmp_path / "set", tmp_path / "code"
    (folder / "manifests").mkdir(parents=True)
    code_dir.mkdir()
    (code_dir / "patchkit_e2e_raising.py").write_text(IMPL)
    doc = patch_doc(id="test.verify-raises", kind="wrap", target=TARGET, implementation="patchkit_e2e_raising:verify",
                    processes=["frontend"], required=True, expected_calls="per_request")
    (folder / "verify_raises.yaml").write_text(yaml.safe_dump(doc))
    release = vllm.__version__  # the release this leg runs on: the set is pinned for it, as its author would
    (folder / "manifests" / f"vllm-{release}.yaml").write_text(yaml.safe_dump(
        {"vllm": release, "generated_by": "test", "patches": [
            {"patch": "test.verify-raises@1", "targets": {TARGET: live_pin(TARGET)}}]}))
    status_dir = tmp_path / "status"
    env = {"VLLM_PATCHKIT_STATUS_DIR": str(status_dir), "VLLM_PATCHKIT_EXTRA_PATCHES": str(folder),
           "VLLM_PATCHKIT_FLUSH_SECONDS": "0.5",
           "PYTHONPATH": os.pathsep.join([str(code_dir), os.environ.get("PYTHONPATH", "")])}
    with serve(tiny_model, env=env, log_path=tmp_path / "server.log") as server:
        for i in range(3):
            with pytest.raises(RequestError) as failed:
                server.complete(f"The number {i} is", max_tokens=4)
            assert failed.value.status >= 400
        with pytest.raises(RequestError) as probe:
            server.get("/patchkit/status")
        assert probe.value.status == 503
        body = json.loads(probe.value.body)
        assert body["exit_code"] == 1
        [problem] = [p for p in body["problems"] if "test.verify-raises@1" in p]
        assert "required patch: its implementation raised" in problem and "KeyError: 'request_budget'" in problem
        assert "patchkit_e2e_raising.py:3" in problem
        scraped = urllib.request.urlopen(server.base_url + "/metrics", timeout=10).read().decode()
        assert 'patch="test.verify-raises"' in scraped and 'state="raised"' in scraped
        assert 'vllm_patchkit_patch_exceptions_total{origin="implementation",patch="test.verify-raises"' in scraped
        assert cli_main(["status", "--dir", str(status_dir)]) == 1
    table = capsys.readouterr().out
    assert "applied, RAISED" in table and "KeyError" in table
