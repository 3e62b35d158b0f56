"""`check --confirm`: each reach or signature breakage check reports, exercised on the release in a child process.

`check` reads a release statically; what it reports is a prediction. Where the release can run here (the installed
vLLM, a copy of its tree put first on the path, or another interpreter that has the release: `--confirm-python`),
each reported name is exercised in one child process, bounded in time (`tools/confirm_child.py`): the import the
plugin makes, the attribute or method it reads on vLLM's class, the attribute a `set`'s class owes vLLM's methods,
the call a used callable's pinned signature took. Each breakage then reads `confirmed` (with the error and the
plugin's line), `not confirmed` (a false alarm on this release: the name is there), or `cannot confirm` (why not).
The verdict of `check` and its exit code are unchanged: confirmation only says how far the prediction was seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Optional

from vllm_patchkit.declaration.names import Target
from vllm_patchkit.upstream.findings import Breakage, BreakageKind

TIMEOUT_S = 180
#: signature changes a caller of a used callable can feel (a new optional parameter cannot break a call)
CALL_KINDS = frozenset({BreakageKind.required_parameter_added, BreakageKind.parameter_removed,
                        BreakageKind.parameter_renamed, BreakageKind.positional_shift,
                        BreakageKind.parameter_kind_changed, BreakageKind.parameter_now_required})
_MARK = "PATCHKIT-CONFIRM "
_VERDICTS = frozenset({"confirmed", "not_confirmed", "cannot"})


class Runner(NamedTuple):
    """How to run the release: an interpreter, and a tree to put first on its path (None: as installed)."""

    python: str
    tree: Optional[str]
    version: str

    def describe(self) -> str:
        where = f" with {self.tree} first on the path" if self.tree else ""
        return f"vLLM {self.version} as {self.python} imports it{where}"


class Confirmation(NamedTuple):
    patch: str
    kind: str
    target: str
    verdict: str  # confirmed | not_confirmed | cannot
    said: str     # the error raised, what was found, or why it could not be tried
    at: Optional[str] = None  # the plugin's file:line the breakage names

    def line(self) -> str:
        head = {"confirmed": "confirmed", "not_confirmed": "NOT CONFIRMED", "cannot": "cannot confirm"}[self.verdict]
        at = f" ({self.at})" if self.at else ""
        return f"  {self.patch} [{self.kind}] {self.target}{at}: {head}: {self.said}"

    def as_dict(self) -> dict:
        return self._asdict()


def runner_for(version: str, source: Optional[str], python: Optional[str]) -> tuple[Optional[Runner], str]:
    """(the runner, "") or (None, why the release cannot run here)."""
    from vllm_patchkit.tools.releases import installed_version

    if source is not None:
        tree = Path(source)
        if not (tree / "vllm" / "__init__.py").is_file():
            return None, (f"{source} is not a tree holding vllm/ (a wheel does not run here: install it into a "
                          "virtualenv and give --confirm-python)")
        return Runner(python or sys.executable, str(tree.resolve()), version), ""
    if python is not None:
        return Runner(python, None, version), ""
    if installed_version() == version:
        return Runner(sys.executable, None, version), ""
    return None, (f"vLLM {version} is not installed here (installed: {installed_version() or 'none'}): give "
                  "--confirm-python PY, an interpreter that has it")


def probe_of(b: Breakage, pinned_signature: Optional[str], provider: Optional[str]) -> Optional[dict]:
    """What the child runs for one breakage (None: not a breakage --confirm exercises)."""
    module, qual = Target.parse(b.target)
    if b.kind == BreakageKind.reach_missing:
        if b.old == "import":
            return {"probe": "import", "module": module, "name": qual}
        if b.old == "provide":
            cls = str(b.detail).rpartition("; ")[2] or provider
            return {"probe": "provided", "class": cls, "name": qual.rpartition(".")[2]} if cls else None
        return {"probe": "member", "module": module, "qual": qual, "what": b.old}
    if b.kind == BreakageKind.target_removed and b.breaking:
        return ({"probe": "member", "module": module, "qual": qual, "what": "method"} if "." in qual
                else {"probe": "import", "module": module, "name": qual})
    if b.kind in CALL_KINDS and b.breaking and pinned_signature:
        return {"probe": "call", "module": module, "qual": qual, "signature": pinned_signature}
    return None


def _plugin_line(b: Breakage) -> Optional[str]:
    return str(b.detail) if b.kind == BreakageKind.reach_missing and b.old != "provide" and b.detail else None


def confirm(report, patch_set, manifests: dict, runner: Optional[Runner], why_not: str = "",
            extra_path: tuple[str, ...] = ()) -> list[Confirmation]:
    """One confirmation per breaking reach/signature breakage of the report, in the report's order."""
    todo: list[tuple[Breakage, Optional[dict]]] = []
    for res in report.results:
        patch = patch_set.patches.get(res.patch)
        pins = _pins(manifests, res.pins_from, res.patch)
        for b in res.breakages:
            if not b.breaking:
                continue
            used = patch is not None and b.target in (patch.uses or [])
            sig = getattr(pins.get(b.target), "signature", None) if used else None
            provider = getattr(patch, "value_from", None) if patch is not None else None
            probe = probe_of(b, sig, provider) if (b.kind not in CALL_KINDS or used) else None
            if probe is not None or b.kind in CALL_KINDS or b.kind == BreakageKind.reach_missing:
                todo.append((b, probe))
    if not todo:
        return []
    if runner is None:
        return [_made(b, {"verdict": "cannot", "why": why_not}) for b, _ in todo]
    probes = [p for _, p in todo if p is not None]
    answers, failure = run_child(runner, probes, extra_path) if probes else ([], "")
    out, it = [], iter(answers)
    for b, probe in todo:
        if probe is None:
            out.append(_made(b, {"verdict": "cannot", "why": "only a used callable's signature is exercised (a "
                                                             "target's change is judged against its callers)"}))
        else:
            out.append(_made(b, next(it, None) or {"verdict": "cannot", "why": failure}))
    return out


def _pins(manifests: dict, release: Optional[str], key: str) -> dict:
    m = manifests.get(release) if release else None
    m = getattr(m, "manifest", m)
    entry = next((e for e in getattr(m, "patches", []) if e.patch == key), None)
    return dict(entry.targets) if entry is not None else {}


def _made(b: Breakage, answer: dict) -> Confirmation:
    said = answer.get("error") or answer.get("found") or answer.get("why") or ""
    if answer.get("how"):
        said = f"{said} — {answer['how']}"
    if answer.get("at"):
        said = f"{said} (raised at {answer['at']})"
    return Confirmation(b.patch, b.kind.value, b.target, answer["verdict"], said, _plugin_line(b))


def run_child(runner: Runner, probes: list[dict], extra_path: tuple[str, ...] = ()) -> tuple[list[dict], str]:
    """(the child's answers in order, "") or ([], why it gave none)."""
    env = dict(os.environ)
    path = [p for p in ([runner.tree] if runner.tree else []) + [env.get("PYTHONPATH", "")] + list(extra_path) if p]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["VLLM_PLUGINS"] = ""  # no plugin loads in the child: it exercises names, it does not serve
    try:
        proc = subprocess.run([runner.python, "-m", "vllm_patchkit.tools.confirm_child"], input=json.dumps(probes),
                              capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return [], f"the child did not answer within {TIMEOUT_S} s"
    except OSError as exc:
        return [], f"the child could not start: {exc}"
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(_MARK)), None)
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return [], f"the child gave no answer (exit {proc.returncode}: {tail[0][:300]})"
    try:
        doc = json.loads(line[len(_MARK):])
        answers = doc["answers"]
    except (ValueError, KeyError, TypeError):  # a garbled answer is no answer, never a verdict
        return [], "the child's answer could not be read"
    if not isinstance(doc, dict) or not isinstance(answers, list) or not all(isinstance(a, dict) and
                                                                           a.get("verdict") in _VERDICTS
                                                                           for a in answers):
        return [], "the child's answer could not be read"
    if doc.get("vllm") != runner.version:
        return [], f"the child imports vLLM {doc.get('vllm')}, not {runner.version}"
    return answers, ""


def render(confirmations: list[Confirmation], runner: Optional[Runner]) -> str:
    if not confirmations:
        return ""
    head = runner.describe() if runner is not None else "the release does not run here"
    counts = {v: sum(c.verdict == v for c in confirmations) for v in ("confirmed", "not_confirmed", "cannot")}
    lines = [f"\nconfirmation by execution ({head}, in a child process): {counts['confirmed']} confirmed, "
             f"{counts['not_confirmed']} not confirmed, {counts['cannot']} could not be tried"]
    return "\n".join(lines + [c.line() for c in confirmations]) + "\n"
