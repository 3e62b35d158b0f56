"""A "moved to X" claim checked against the function's identity, never its name alone.

The release's search (`static_moved.MovedSearch`) proposes every other definition of the same class-and-member
(or function) name. A candidate is the target's new home only when
  (a) it did not exist under that name on the release the pins were read from (when that release is at hand):
      a V1 runner method is not "moved" to the V2 runner's method of the same name that was already there;
  (b) it is the same function: the pinned parameters all survive by name (none removed or renamed; added ones
      are fine, moves commonly thread a new argument through; the receiver is left out), and its normalised body is at least SIMILARITY alike
      the pinned one (token-level `difflib` ratio over `ast.unparse` without docstring), or, when the pinned
      release's source is not at hand, its source digest equals the pinned one. With neither a pinned body nor a
      digest, (b) is the signature alone, and the claim says so ("identity by signature alone").
Otherwise the target is "not found in this release" (target_removed), and the reason names the same-name
definitions that were ruled out and why.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Optional

from vllm_patchkit.declaration.pins import Fingerprint
from vllm_patchkit.upstream.missing import Missing
from vllm_patchkit.upstream.sigdiff import parse_signature
from vllm_patchkit.upstream.sourcediff import normalised_lines

#: measured on the corpus's real releases (scripts/corpus_report.py, docs/troubleshooting.md): the real moves of
#: 0.33.0 (kv_cache_utils -> kv_cache_planning) are 0.55-0.95 alike, the same-name V2 runner methods on 0.34.0
#: 0.04-0.28 and an override folded into its base 0.48
SIMILARITY = 0.5

_BOUND = ("method", "classmethod")
_TOKEN = re.compile(r"\w+|\S")


def similarity(old: Any, new: Any) -> float:
    """How alike two definitions' bodies are (0..1): their normalised code, token by token, the `def` line left
    out (the signature is judged on its own)."""
    a = _TOKEN.findall("\n".join(normalised_lines(old)[1:]))
    b = _TOKEN.findall("\n".join(normalised_lines(new)[1:]))
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def confirm_moves(release: Any, pinned_on: Optional[Any], spec: str, pin: Fingerprint,
                  missing: Missing) -> Missing:
    """`missing` with `moved_to` kept to the candidates that are the pinned function (rules above); the others
    named in the reason."""
    if not missing.moved_to or missing.inherited_from or missing.unreadable:
        return missing
    old_body = pinned_on.definition(spec) if pinned_on is not None else None
    kept, ruled_out, weak = [], [], False
    for home in missing.moved_to:
        why = _not_the_same(release, pinned_on, old_body, spec, pin, home)
        if why is None or why is _SIGNATURE_ONLY:
            kept.append(home)
            weak = weak or why is _SIGNATURE_ONLY
        else:
            ruled_out.append(f"{home} ({why})")
    reason = missing.reason
    if ruled_out:
        reason += "; not moved to the same-name " + ", ".join(ruled_out)
    if weak:
        reason += "; identity by signature alone: the pinned release's source is not at hand"
    return missing if reason == missing.reason else Missing(missing.spec, reason, tuple(kept))


def _lost_parameters(pin: Fingerprint, there: Fingerprint) -> list[str]:
    """The pinned parameters (receiver left out: a method may move as a staticmethod) the candidate lacks."""
    old, new = (parse_signature(f.signature) if f.signature else None for f in (pin, there))
    if old is None or new is None:
        return []
    names = [[p.name for p in ps[1 if f.kind in _BOUND else 0:]] for ps, f in ((old, pin), (new, there))]
    return [n for n in names[0] if n not in names[1]]


def _not_the_same(release: Any, pinned_on: Optional[Any], old_body: Any, spec: str, pin: Fingerprint,
                  home: str) -> Optional[str]:
    """Why `home` is not where `spec` went, or None when it is."""
    ver = pinned_on.version() if pinned_on is not None else None
    if pinned_on is not None and isinstance(pinned_on.lookup(home), Fingerprint):
        return f"it already existed at vLLM {ver}"
    there = release.lookup(home, pin.source_digest is not None)
    if isinstance(there, Missing):
        return there.reason
    lost = _lost_parameters(pin, there)
    if lost:
        return "parameter(s) " + ", ".join(repr(n) for n in lost) + " of the pinned signature not there"
    new_body = release.definition(home)
    if old_body is not None and new_body is not None:
        alike = similarity(old_body, new_body)
        return None if alike >= SIMILARITY else f"its body is {alike:.0%} like the pinned one, under {SIMILARITY:.0%}"
    if pin.source_digest is not None:
        return None if there.source_digest == pin.source_digest else "its source digest differs from the pinned one"
    return _SIGNATURE_ONLY


_SIGNATURE_ONLY = "signature only"
