"""Generate the docs that describe the patch set, from the YAML: patches, env vars, manifests (and the
framework's failure codes, from their rows: `docs_failures.py`).

One source of truth per fact: prose about a patch lives in its YAML; these
pages are rendered from it, open with a DO-NOT-EDIT header naming the command,
and `vllm-patchkit docs --check` (run by the test suite) fails when they drift.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import msgspec
from packaging.version import Version

from vllm_patchkit.declaration.declare import load_patch_set, manifest_dirs
from vllm_patchkit.declaration.kinds import traits
from vllm_patchkit.declaration.patchsets import PatchSet
from vllm_patchkit.declaration.knobs import KNOBS
from vllm_patchkit.declaration.manifest import Loaded, load_manifests
from vllm_patchkit.declaration.names import PatchKey
from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.tools import docs_failures

COMMAND = "vllm-patchkit docs"
HEADER = (
    "<!-- DO NOT EDIT: generated from patches/*.yaml and manifests/*.yaml by `{cmd}`. "
    "Edit the YAML, then run `{cmd}`. -->\n\n"
).format(cmd=COMMAND)


def _when(p: Patch) -> list[str]:
    out = []
    for name, value in msgspec.structs.asdict(p.when).items():
        if value is None:
            continue
        if name == "env":
            value = ", ".join(f"{k}={'unset' if v is None else v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(f"`{v}`" for v in value)
        out.append(f"`{name}`: {value}")
    return out


def _listing(patch_id: str, m) -> tuple:
    """(manifest entry, not-applicable entry) of a patch id in one manifest; either may be None."""
    entry = next((e for e in m.patches if PatchKey.parse(e.patch).id == patch_id), None)
    na = next((n for n in m.not_applicable if n.patch == patch_id), None)
    return entry, na


def _releases(patch_id: str, manifests: dict[str, Loaded]) -> list[str]:
    rows = []
    for ver in sorted(manifests, key=Version):
        entry, na = _listing(patch_id, manifests[ver].manifest)
        if entry is not None:
            rows.append(f"vLLM {ver}: version {PatchKey.parse(entry.patch).version}")
        elif na is not None:
            rows.append(f"vLLM {ver}: not applicable — {na.reason}")
        else:
            rows.append(f"vLLM {ver}: not listed")
    return rows


def _shown(file: str) -> str:
    """A path as the docs show it: relative to the project holding it (stable across machines)."""
    path = Path(file).resolve()
    for parent in path.parents:
        if (parent / "pyproject.toml").exists():
            return path.relative_to(parent).as_posix()
    return path.name


def render_patches(ps: PatchSet, manifests: dict[str, Loaded]) -> str:
    lines = [HEADER, "# The patch set\n",
             "Every intervention on vLLM, one section per patch id (newest version shown).\n"]
    newest: dict[str, Patch] = {}
    for p in ps.patches.values():
        if p.id not in newest or p.version > newest[p.id].version:
            newest[p.id] = p
    for pid in sorted(newest):
        lines.append(f"- [`{pid}`](#{pid.replace('.', '')})")
    lines.append("")
    for pid in sorted(newest):
        p = newest[pid]
        rw = p.retire_when
        retire = f"vLLM `{rw.vllm}`" if rw.vllm else (f"probe `{rw.probe}`" if rw.probe else rw.manual)
        lines += [
            f"## {pid}\n",
            f"{p.summary.strip()}\n",
            f"- **Patch set:** `{ps.set_of.get(p.key, '-')}`" + (f"; feature `{p.feature}` (upstream, retirement "
                                                                  "and shared env vars declared once there)"
                                                                  if p.feature else ""),
            f"- **Why:** {' '.join(p.why.split())}",
            f"- **Upstream:** {p.upstream}",
            f"- **Retire when:** {retire}",
            f"- **Kind:** `{p.kind.value}`" + (" (counted passthrough)" if traits(p).wraps_original and not p.implementation else ""),
            f"- **Target:** `{p.target}`" if p.target else "- **Target:** none",
        ]
        if p.copies:
            lines.append("- **Copies patched too:** " + ", ".join(f"`{c}`" for c in p.copies))
        if p.uses:
            lines.append("- **Upstream callables it uses (pinned):** " + ", ".join(f"`{c}`" for c in p.uses))
        if p.implementation:
            lines.append(f"- **Implementation:** `{p.implementation}`")
        if p.params:
            lines.append("- **Target parameters it reads (`params`):** " + ", ".join(f"`{n}`" for n in p.params))
        if p.env_default:
            lines.append(f"- **Sets default:** `{p.env_default.name}={p.env_default.value}` (an explicit value is kept)")
        if p.message:
            lines.append(f"- **Refusal message:** {' '.join(p.message.split())}")
        lines.append("- **Processes:** " + ", ".join(x.value for x in p.processes))
        when = _when(p)
        lines.append("- **Preconditions:** " + ("; ".join(when) if when else "none") + f" (judged at the {p.stage} stage)")
        if p.requires:
            lines.append("- **Requires:** " + ", ".join(f"`{r}`" for r in p.requires))
        lines.append(f"- **Required:** {'yes (fails closed: start-up stops)' if p.required else 'no (a failure is recorded and logged)'}")
        lines.append(f"- **Expected calls:** {p.expected_calls.value}")
        if p.env_vars:
            lines.append("- **Env vars read:** " + ", ".join(f"`{e.name}`" for e in p.env_vars))
        lines.append("- **Versions per vLLM release:** " + "; ".join(_releases(pid, manifests)))
        lines.append(f"- **Declared in:** `{_shown(ps.files[p.key])}`\n")
    return "\n".join(lines).rstrip() + "\n"


def render_env(ps: PatchSet) -> str:
    lines = [HEADER, "# Environment variables\n",
             "Every variable the framework and the patch set read. All are registered in "
             "`vllm.envs.environment_variables` by the plugin entry point.\n",
             "| name | default | meaning | declared by |", "|---|---|---|---|"]
    rows = [(k.name, k.default, k.doc, "framework") for k in KNOBS]
    seen = {r[0] for r in rows}
    for p in sorted(ps.patches.values(), key=lambda p: p.key):
        for e in p.env_vars:
            if e.name in seen:
                continue
            seen.add(e.name)
            rows.append((e.name, e.default, e.doc, f"feature `{p.feature}`" if p.feature else f"`{p.id}`"))
    for name, default, doc, by in rows:
        d = "unset" if default is None else f"`{default}`"
        lines.append(f"| `{name}` | {d} | {' '.join(doc.split())} | {by} |")
    return "\n".join(lines) + "\n"


def render_manifests(ps: PatchSet, manifests: dict[str, Loaded]) -> str:
    versions = sorted(manifests, key=Version)
    lines = [HEADER, "# Manifests\n", "Which patch version applies on which vLLM release "
             "(`n/a`: marked not applicable, reason below; `—`: not listed).\n",
             "| patch | " + " | ".join(f"vLLM {v}" for v in versions) + " |",
             "|---|" + "---|" * len(versions)]
    ids = sorted({p.id for p in ps.patches.values()})
    reasons = []
    for pid in ids:
        cells = []
        for v in versions:
            entry, na = _listing(pid, manifests[v].manifest)
            if entry is not None:
                cells.append(f"v{PatchKey.parse(entry.patch).version}")
            elif na is not None:
                cells.append("n/a")
                reasons.append(f"- `{pid}` on vLLM {v}: {' '.join(na.reason.split())}")
            else:
                cells.append("—")
        lines.append(f"| `{pid}` | " + " | ".join(cells) + " |")
    if reasons:
        lines += ["", "## Not applicable\n", *reasons]
    lines += ["", "## Why each version\n",
              "A release gets the version its manifest lists; `vllm-patchkit pin` chooses among the versions whose "
              "`when.vllm` admits the release, carrying the one listed before forward when every upstream "
              "change is compatible for it (see docs/troubleshooting.md, compatibility).\n"]
    for pid in ids:
        versions_of = sorted(ps.by_id(pid), key=lambda p: p.version)
        if len(versions_of) > 1 or versions_of[0].when.vllm:
            lines.append(f"- `{pid}`: " + "; ".join(
                f"v{p.version} admits {'`' + p.when.vllm + '`' if p.when.vllm else 'every release'} "
                f"(target `{p.target}`)" for p in versions_of))
    lines += ["", "## Releases no manifest pins\n",
              "A patch or post release, a dev build or a source tree of vLLM with no manifest of its own is judged, by "
              "default (`VLLM_PATCHKIT_ON_UNKNOWN_VLLM=nearest`), per patch against the pins of the **nearest pinned "
              "release**: the newest release of the table above at or below its release segment (PEP 440: 0.31.1 and 0.31.0.post1 "
              "-> 0.31.0; 0.34.1.dev12+g... -> 0.34.1 if pinned, else 0.34.0). A local label (`+cpu`) is the same "
              "release; a vLLM older than every release above is handled as `skip`. A needed patch applies only where "
              "every live fingerprint it depends on equals that pin, and its record says \"verified against the pins "
              "of 0.31.0 on 0.31.1\" (a warning in `status`); a difference refuses it, naming the target. `when.vllm` "
              "is judged on the running release, never on the nearest one. Why this is as safe as an exact pin: "
              "docs/troubleshooting.md, \"A release no manifest pins\".\n"]
    lines += ["", "## Files\n"] + [f"- vLLM {v}: `{_shown(manifests[v].path)}` (merged with every set's manifest for vLLM {v}) "
                                   f"({manifests[v].manifest.generated_by})" for v in versions]
    return "\n".join(lines) + "\n"


def generate(patch_dirs: Optional[list[Path]] = None, manifest_dir: Optional[Path] = None) -> dict[str, str]:
    from vllm_patchkit.declaration.patchsets import discover

    sources = patch_dirs or discover(with_env=False)
    ps = load_patch_set(sources)
    ms = load_manifests([manifest_dir] if manifest_dir else manifest_dirs(sources), ps)
    return {
        "patches.md": render_patches(ps, ms),
        "env.md": render_env(ps),
        "manifests.md": render_manifests(ps, ms),
        docs_failures.NAME: docs_failures.render(),
    }


def write_or_check(out_dir: Path, check: bool) -> list[str]:
    """Write the pages, or (check) return the names of those that are missing or stale."""
    stale = []
    for name, text in generate().items():
        path = out_dir / name
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(name)
            if not check:
                out_dir.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return stale
