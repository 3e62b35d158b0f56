"""Bounds a declaration file's YAML must keep, checked on its composed nodes before any value is built.

Why: a YAML alias shares one node, so a few hundred bytes of nested anchors and aliases ("billion laughs")
stand for 9**9 values. PyYAML composes and builds each aliased node once, so reading is cheap; whatever walks
the built value afterwards (the start-up cache's JSON writer, an error message's repr, the validator) walks
every one of them: gigabytes and minutes, with no message. So aliases are counted while the file is composed,
and the size of each node once expanded is computed once per node (memoised: the node graph stays small) and
refused over a bound, naming the field, before anything is built. A string's length and a collection's
number of entries are bounded too (a 4 MB map in an unknown key took 32 s and 927 MiB to reject).
"""

from __future__ import annotations

import yaml

#: Aliases (`*name`, `<<: *name`) one declaration file may use. The shipped files use none.
MAX_ALIASES = 1_000
#: Values (every scalar, mapping and list, each key too) one file may hold as written, counted while composing:
#: PyYAML's pure-Python reader takes 0.03-0.1 ms a value, so this bounds the time to read a file (0.3-1 s).
#: The largest YAML of this repository holds ~3,800; a manifest of a big set a few thousand.
MAX_COMPOSED = 10_000
#: Values one file may hold once its aliases are expanded.
MAX_NODES = 100_000
#: Entries of one mapping or one list.
MAX_ENTRIES = 5_000
#: Characters of one scalar (a `why` of a long story is a few kB).
MAX_CHARS = 64 * 1024


class TooLarge(Exception):
    """A file over one of the bounds: `where` (a field path, or `line N`) and what was found."""

    def __init__(self, where: str, problem: str):
        self.where, self.problem = where, problem
        super().__init__(f"{where}: {problem}")


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts the values and the aliases it composes, and stops past `MAX_COMPOSED`
    or `MAX_ALIASES`, naming the field it was reading."""

    def __init__(self, stream):
        super().__init__(stream)
        self.aliases = self.composed = 0
        self._at: list = []  # the index (a key node, a list position) of every node being composed

    def _where(self) -> str:
        out = ""
        for index in self._at:
            if isinstance(index, int):
                out += f"[{index}]"
            elif isinstance(index, yaml.ScalarNode):
                out += ("." if out else "") + str(index.value)
        line = self.peek_event().start_mark.line + 1
        return out or f"line {line}"

    def compose_node(self, parent, index):
        self._at.append(index)
        try:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_ALIASES:
                    raise TooLarge(self._where(), f"more than {MAX_ALIASES:,} aliases (*name) in one file: a "
                                                  "declaration needs few or none (refused before they are expanded)")
            else:
                self.composed += 1
                if self.composed > MAX_COMPOSED:
                    raise TooLarge(self._where(), f"more than {MAX_COMPOSED:,} values in one file (a declaration "
                                                  "holds a few thousand at most): not read further")
            return super().compose_node(parent, index)
        finally:
            self._at.pop()


def _path(path: str, key: yaml.Node) -> str:
    name = key.value if isinstance(key, yaml.ScalarNode) else "<key>"
    return f"{path}.{name}" if path else str(name)


def check_size(root: yaml.Node) -> None:
    """Raise TooLarge at the first node (in document order) whose expanded size, whose string or whose number
    of entries is over its bound, or that contains itself (a recursive alias). Each node is visited once."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node, path: str) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        where = path or "<file>"
        if isinstance(node, yaml.ScalarNode):
            if len(node.value) > MAX_CHARS:
                raise TooLarge(where, f"a value of {len(node.value):,} characters, more than the {MAX_CHARS:,} a "
                                      "declaration's value may have")
            sizes[key] = 1
            return 1
        if key in open_nodes:
            raise TooLarge(where, "a value that contains itself (a recursive alias): not a declaration")
        if len(node.value) > MAX_ENTRIES:
            what = "mapping" if isinstance(node, yaml.MappingNode) else "list"
            raise TooLarge(where, f"{len(node.value):,} entries in one {what}, more than the {MAX_ENTRIES:,} a "
                                  "declaration may have")
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            children = ((part, _path(path, k)) for k, v in node.value for part in (k, v))
        else:
            children = ((item, f"{path}[{i}]") for i, item in enumerate(node.value))
        for child, child_path in children:
            total += size(child, child_path)
            if total > MAX_NODES:
                raise TooLarge(where, f"more than {MAX_NODES:,} values once its aliases are expanded (an alias "
                                      "bomb?): refused before they are expanded")
        open_nodes.discard(key)
        sizes[key] = total
        return total

    size(root, "")
