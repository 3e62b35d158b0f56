"""What a patch-set entry point's answer depends on: the files of its distribution it ran and the env vars it read.

Why: the start-up cache serves a warm process the sets an earlier process got by calling every entry point, so it
must know what that call depended on; an input it does not know of is an edit a warm start ignores while a cold
one sees it (issue 33, item 5). The entry point is called once, on the cold path, while this module watches it:

- **modules**: every module of the entry point's distribution in `sys.modules` once the call returned (its
  top-level packages: `top_level.txt`, else the first parts of its RECORD, and always the entry point's own),
  whether the call imported it or something before it did. A superset of what the call ran, so an edit of any of
  them rebuilds the entry; modules of other distributions change with their install (the installation stamp).
- **environment**: every variable read through `os.environ` / `os.environb` / `os.getenv` while the entry point is
  loaded and called, present or not, found by swapping `os._Environ`'s item lookup for a recording one for the
  length of the call (the class, so a module holding `from os import environ` is seen too). Enumerating the
  environment (iterating, copying, `len`) records `ALL`: the answer may depend on any variable, and such a set is
  not cached. Not seen: a read at the import of a module imported before the call, and a read in C (`getenv(3)`):
  the set declares those (`PatchSetSource.env`). Only the cold path pays for this; a warm process calls nothing.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

ALL = "*"  # the entry point enumerated the environment


@contextmanager
def watching_environ() -> Iterator[set[str]]:
    """The names of the environment variables read while the block runs (`ALL` among them if it enumerated them)."""
    reads: set[str] = set()
    cls: Any = os._Environ
    lookup, iterate, length = cls.__getitem__, cls.__iter__, cls.__len__

    def recorded_lookup(self, key):
        reads.add(key if isinstance(key, str) else os.fsdecode(key))
        return lookup(self, key)

    def recorded_iterate(self):
        reads.add(ALL)
        return iterate(self)

    def recorded_length(self):
        reads.add(ALL)
        return length(self)

    cls.__getitem__, cls.__iter__, cls.__len__ = recorded_lookup, recorded_iterate, recorded_length
    try:
        yield reads
    finally:
        cls.__getitem__, cls.__iter__, cls.__len__ = lookup, iterate, length


def _top_level_names(ep) -> set[str]:
    names = {ep.module.split(".")[0]}
    dist = getattr(ep, "dist", None)
    if dist is None:
        return names
    try:
        top = dist.read_text("top_level.txt")
        if top is None:  # a backend that writes none (flit, hatch): the first parts of the files it installed
            record = dist.read_text("RECORD") or ""
            top = "\n".join(line.split(",", 1)[0].split("/", 1)[0] for line in record.splitlines())
    except OSError:
        return names
    for name in top.split():
        name = name.removesuffix(".py")
        if name.isidentifier():
            names.add(name)
    return names


def module_files(ep) -> list[str]:
    """The files the entry point's answer depends on: its module and the packages above it (what `ep.load()` ran),
    every module of its distribution imported by now, and its distribution's metadata (where the entry point
    itself is declared)."""
    out: list[str] = []
    parts = ep.module.split(".")
    for i in range(len(parts)):
        file = getattr(sys.modules.get(".".join(parts[: i + 1])), "__file__", None)
        if file:
            out.append(os.path.abspath(file))
    tops = _top_level_names(ep)
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in tops:
            file = getattr(module, "__file__", None)
            if isinstance(file, str):
                out.append(os.path.abspath(file))
    info = getattr(getattr(ep, "dist", None), "_path", None)  # the dist-info folder (importlib.metadata.PathDistribution)
    if info is not None:
        out += [os.path.join(str(info), n) for n in ("entry_points.txt", "METADATA", "RECORD")]
    return list(dict.fromkeys(out))
