"""Start a real vLLM OpenAI server on loopback for a test, and always tear it down.

Why: patches must be seen working in every vLLM process (API server,
EngineCore, workers). Only a real server shows that, and a harness that leaks
an EngineCore between tests poisons every later one, so the server runs in its
own process group and the whole group is killed on exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
# Never reach outside the machine: no usage stats, no hub look-ups, and vLLM's
# inter-process queues bound to loopback instead of the host's own address.
_QUIET_ENV = {
    "VLLM_HOST_IP": HOST,
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
# Loopback only: ignore any *_proxy variables of the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerError(RuntimeError):
    """The server died or did not become ready; the message ends with its log tail."""


class RequestError(RuntimeError):
    """The server answered with an HTTP error; keeps the status and vLLM's error body."""

    def __init__(self, url: str, status: int, body: str):
        super().__init__(f"HTTP {status} from {url}: {body}")
        self.url, self.status, self.body = url, status, body


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 60) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _http(method: str, url: str, body: dict | None = None, timeout: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise RequestError(url, exc.code, exc.read().decode(errors="replace")) from None
    return json.loads(raw) if raw else None


@dataclass
class Server:
    """A running server: where it listens, its pid and log, and request helpers."""

    base_url: str
    pid: int
    log_path: Path
    model: str
    proc: subprocess.Popen = field(repr=False)

    def get(self, path: str, timeout: float = 10.0):
        return _http("GET", self.base_url + path, timeout=timeout)

    def post(self, path: str, body: dict, timeout: float = 120.0):
        return _http("POST", self.base_url + path, body, timeout=timeout)

    def complete(self, prompt: str, max_tokens: int = 16, **kw) -> dict:
        """POST /v1/completions; greedy (temperature 0) unless ``kw`` says otherwise."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, **kw}
        return self.post("/v1/completions", body)

    def processes(self) -> dict[int, str]:
        """The server and all its descendants, pid -> process title (``/proc/PID/comm``)."""
        out = {}
        for pid in sorted({self.pid} | _descendants(self.pid)):
            with contextlib.suppress(OSError):
                out[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
        return out

    def complete_tokens(self, token_ids: Sequence[int], max_tokens: int = 16, **kw) -> dict:
        """Same as ``complete`` with the prompt given as token ids (no tokenizer, no BOS added)."""
        return self.complete([int(t) for t in token_ids], max_tokens=max_tokens, **kw)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _descendants(pid: int) -> set[int]:
    """Pids below ``pid`` (from /proc), to catch a child that left the process group."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the server's process group, wait up to ``grace`` s, then SIGKILL what is left."""
    pgid = proc.pid  # start_new_session=True: the leader's pid is the group id
    stragglers = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    for p in stragglers:  # children that moved to a group of their own get it too
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(p) != pgid:
                os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if not _alive(pgid) and not any(pid_alive(p) for p in stragglers):
            break
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        for p in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _wait_ready(proc: subprocess.Popen, base_url: str, log_path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServerError(
                f"vLLM server exited with code {proc.returncode} before it was ready; "
                f"last lines of {log_path}:\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise ServerError(
                f"vLLM server not ready after {timeout:.0f} s; last lines of {log_path}:\n"
                f"{log_tail(log_path)}")
        try:
            _http("GET", base_url + "/health", timeout=5)
            models = _http("GET", base_url + "/v1/models", timeout=5)
            return models["data"][0]["id"]
        except (OSError, RequestError, ValueError, KeyError, IndexError):
            time.sleep(0.5)


@contextlib.contextmanager
def serve(model_dir, *, port: int | None = None, extra_args: Sequence[str] = (),
          env: Mapping[str, str] | None = None, timeout: float = 240,
          log_path=None) -> Iterator[Server]:
    """Serve ``model_dir`` with vLLM on 127.0.0.1 until the block exits.

    The process and all its children (EngineCore, workers) are gone on exit,
    also when start-up fails. Raises ``ServerError`` with the log tail if the
    server dies or is not ready within ``timeout`` seconds.
    """
    model = str(model_dir)
    port = port or free_port()
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="vllm-patchkit-serve-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8",
           "--host", HOST, "--port", str(port), *extra_args]
    full_env = {**os.environ, **_QUIET_ENV, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    base_url = f"http://{HOST}:{port}"
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
    try:
        served = _wait_ready(proc, base_url, log_path, timeout)
        yield Server(base_url=base_url, pid=proc.pid, log_path=log_path, model=served,
                     proc=proc)
    finally:
        stop(proc)
