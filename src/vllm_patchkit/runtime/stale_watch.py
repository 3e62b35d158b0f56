"""Stale copies: a module that took an applied function by value (`from x import f`) and is not a declared
copy keeps calling the original, bypassing the patch. The stage searches by name; the flusher searches every
name of every module once start-up is over (copies bound later, under other names)."""

from __future__ import annotations

import logging
from typing import Any, Optional

from vllm_patchkit.declaration.schema import Patch
from vllm_patchkit.runtime.applied import Applied
from vllm_patchkit.runtime.kinds import kind_of
from vllm_patchkit.runtime.ledger import Ledger
from vllm_patchkit.runtime.verify import Verified, stale_copies
from vllm_patchkit.upstream.targets import function_of, main_aliases
from vllm_patchkit.upstream.findings import Finding

log = logging.getLogger("vllm.patchkit")


class StaleWatch:
    """The stale-copy searches of one process; owns `originals`: id(original) -> (patch id, declared places, the
    original), for every applied function patch. Reads the applied patches (only those still applied are searched
    again) and writes findings into the ledger's records."""

    def __init__(self, ledger: Ledger, applied: dict[str, Applied]):
        self.ledger = ledger
        self.applied = applied
        self.originals: dict[int, tuple[str, set[str], Any]] = {}

    def watch(self, patch: Patch, place: Any) -> Optional[int]:
        """Remember an applied (or about to be) function patch's original for the stale-copy searches."""
        if place is None or place.owner_is_class or not kind_of(patch).installs_function:
            return None
        declared = {patch.target, *patch.copies}
        original = function_of(place.get_raw())
        self.originals[id(original)] = (patch.id, declared, original)
        return id(original)

    def watch_applied(self, patch: Patch, applied: Applied) -> None:
        """A patch applied lazily: its original is known from the install (the target holds the wrapper now)."""
        place = applied.places[0][0]
        if applied.original is not None and not place.owner_is_class and kind_of(patch).installs_function:
            self.originals[id(applied.original)] = (patch.id, {patch.target, *patch.copies}, applied.original)

    def clear(self) -> None:
        self.originals.clear()

    def _findings(self, found: dict[str, list[str]]) -> int:
        new = 0
        for patch_id, places in found.items():
            rec = self.ledger.records[patch_id]
            seen = {f.get("where") for f in rec.findings if f.get("code") == "stale_copy"}
            for where in places:
                if where in seen:
                    continue
                rec.findings.append(Finding("stale_copy", f"{where} holds the original by value and is not a declared "
                                            "copy; calls through it bypass the patch", where=where).as_record())
                log.warning("vllm-patchkit: %s: stale copy at %s (not declared in `copies`)", rec.patch, where)
                new += 1
        return new

    def _searched(self, ids) -> dict[int, tuple[str, set[str]]]:
        out = {}
        for key in ids:
            patch_id, declared, _ = self.originals[key]
            out[key] = (patch_id, declared | set(main_aliases(declared)))  # `python -m` runs a module as __main__
        return out

    def report(self, decisions: list[tuple[Patch, Verified]]) -> None:
        """At a stage: the by-name search (every name in vLLM's modules, the target's own name elsewhere)."""
        names: dict[str, list[int]] = {}
        for patch, v in decisions:
            key = self.watch(patch, v.place)
            if key is not None:
                names.setdefault(v.place.attr, []).append(key)
        keys = [k for ks in names.values() for k in ks]
        self._findings(stale_copies(self._searched(keys), names))

    def rescan(self) -> int:
        """Every name of every module, for every applied function patch: the copies bound after start-up (the
        plugin's own modules, model code, targets applied lazily) and under other names (`from x import f as
        g`). The flusher runs it off the start-up path (~30 ms with vLLM's engine loaded); returns the new
        findings."""
        live = [k for k, (patch_id, _, _) in self.originals.items() if patch_id in self.applied]
        if not live:
            return 0
        return self._findings(stale_copies(self._searched(live)))
