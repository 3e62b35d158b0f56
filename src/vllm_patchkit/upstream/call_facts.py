"""What vLLM's calls to a place pass, as a pin holds it (`call_positional`, `call_keywords`: read by
`tools/static_calls.py`), and which convention problems need a call vLLM never makes: a replacement is judged
against the calls vLLM makes to it (issue 31), never one its definition merely admits."""

from __future__ import annotations

from typing import Any, Optional

from vllm_patchkit.upstream.findings import Finding


def pinned_calls(pin: Any) -> Optional[tuple]:
    """(most positional arguments, keywords) of vLLM's calls as a fingerprint holds them; None: not read."""
    n = getattr(pin, "call_positional", None)
    return None if n is None else (n, tuple(getattr(pin, "call_keywords", None) or ()))


_BY_POSITION = frozenset({"not_positional", "reordered", "keyword_only"})
_BY_KEYWORD = frozenset({"not_by_keyword", "renamed", "kwonly_not_accepted"})


def never_called(f: Finding, target: list, calls: tuple, target_kind: Optional[str]) -> bool:
    """Does the problem need a call vLLM does not make? `calls`: (the most positional arguments, the keywords)
    of vLLM's calls. What a problem does not tie to one parameter's passing is always kept."""
    positional, keywords = calls[0], set(calls[1])
    t_pos = [p for p in target if p.positional]
    bound = 1 if (target_kind in ("method", "classmethod") or (target_kind is None and t_pos
                                                                and t_pos[0].name in ("self", "cls"))) else 0
    p = next((p for p in target if p.name == f.where), None)
    reached = p is not None and p.positional and p.position - bound < positional
    if f.code in _BY_POSITION:
        return p is not None and p.positional and not reached
    if f.code in _BY_KEYWORD:
        return f.where not in keywords
    if f.code == "dropped":
        return f.where not in keywords and not reached
    if f.code == "no_varargs":
        return positional <= len(t_pos) - bound
    if f.code == "no_varkw":
        return keywords <= {p.name for p in target}
    return False
