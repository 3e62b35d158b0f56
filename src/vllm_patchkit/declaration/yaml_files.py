"""Reading a declaration file: YAML with duplicate keys refused, depth, size and alias expansion bounded
(`yaml_bounds`), and pydantic's validation errors turned into errors naming the file and the field, with a
bounded repr of the input (never a traceback from deep inside)."""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path

import yaml
from pydantic import ValidationError

from vllm_patchkit.declaration.errors import DeclarationError, PatchSetErrors
from vllm_patchkit.declaration.yaml_bounds import BoundedLoader, TooLarge, check_size


def _field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<file>"


def _rule_field(model: type, msg: str) -> str | None:
    """The field a document-level rule is about, read from its message.

    Rules spanning several fields ("kind 'wrap' needs 'target'") are checked on the
    whole document, so pydantic reports them at the root; name the field the message
    quotes (or, failing that, mentions) instead of the document.
    """
    fields = getattr(model, "model_fields", {})
    for name in re.findall(r"'([A-Za-z_]+)", msg):
        if name in fields:
            return name
    for word in re.findall(r"[A-Za-z_]+", msg):
        for name in (word, word + "s"):
            if name in fields:
                return name
    return None


# the `(got ...)` of an error: a bounded repr, so a big input is never repr'd whole to be cut to 80 characters
_INPUT_REPR = reprlib.Repr()
_INPUT_REPR.maxlevel, _INPUT_REPR.maxstring, _INPUT_REPR.maxother = 3, 60, 60
_INPUT_REPR.maxlist = _INPUT_REPR.maxtuple = _INPUT_REPR.maxdict = _INPUT_REPR.maxset = 4


def input_repr(value: object, limit: int = 80) -> str:
    return _INPUT_REPR.repr(value)[:limit]


def validation_errors(file: str, exc: ValidationError, model: type | None = None) -> list[DeclarationError]:
    errs = []
    for e in exc.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "value_error" and msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (not in the schema; typo?)"
        elif not loc and e["type"] == "value_error":
            loc = (_rule_field(model, msg) or "<file>",)  # the input is the whole document: don't echo it
        elif "input" in e and e["type"] not in ("missing",):
            msg = f"{msg} (got {input_repr(e['input'])})"
        errs.append(DeclarationError(file, _field_path(loc), msg))
    return errs


def _node_path(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _duplicate_keys(node: yaml.Node, path: str, seen: set[int]) -> list[tuple[str, int, int]]:
    """(field path, first line, second line) of every key given twice in one mapping.

    PyYAML keeps the last of two equal keys without a word, which turns a pasted
    or mistyped line into a silent change of meaning. YAML merge keys (`<<`) are
    left alone: overriding a merged key is what they are for.
    """
    if id(node) in seen:  # an alias seen before (possibly a cycle)
        return []
    seen.add(id(node))
    found = []
    if isinstance(node, yaml.MappingNode):
        first: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            here = _node_path(path, key)
            if key is not None:
                line = key_node.start_mark.line + 1
                if (key_node.tag, key) in first:
                    found.append((here, first[(key_node.tag, key)], line))
                else:
                    first[(key_node.tag, key)] = line
            found += _duplicate_keys(value_node, here, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _duplicate_keys(item, f"{path}[{i}]", seen)
    return found


#: The largest declaration file read (a patch, manifest or feature is a few kB; a manifest of a big set tens of kB).
MAX_BYTES = 4 * 1024 * 1024


def _read_text(path: Path) -> str:
    """A regular file's text, never blocking on a FIFO or a device (opened O_NONBLOCK, checked on the descriptor)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError("not a regular file (a FIFO, a device or a folder)")
        if st.st_size > MAX_BYTES:
            raise OSError(f"{st.st_size} bytes, more than the {MAX_BYTES} a declaration file may have")
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read(MAX_BYTES + 1).decode("utf-8")
    finally:
        if fd >= 0:
            os.close(fd)


def read_yaml(path: Path) -> object:
    try:
        text = _read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(str(path), "<file>", f"cannot read: {exc}") from None
    loader = None
    try:
        loader = BoundedLoader(text)  # checks the characters first: inside the try; counts aliases
        node = loader.get_single_node()
        if node is None:
            return None
        check_size(node)  # before anything walks the expansion: duplicates, construction, validation
        duplicates = _duplicate_keys(node, "", set())
        if duplicates:
            errors = [DeclarationError(str(path), where, f"duplicate key (line {a} and line {b}); "
                                       "YAML would keep only the last one silently")
                      for where, a, b in duplicates]
            raise errors[0] if len(errors) == 1 else PatchSetErrors(errors)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f"line {mark.line + 1}"
        elif isinstance(getattr(exc, "position", None), int):  # ReaderError: a character YAML forbids
            where = f"line {text.count(chr(10), 0, exc.position) + 1}"
        else:
            where = "<file>"
        raise DeclarationError(str(path), where, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except TooLarge as exc:
        err = DeclarationError(str(path), exc.where, exc.problem)
        err.over_bound = True  # refused by a bound of yaml_bounds: not worth reading again for its id
        raise err from None
    except RecursionError:
        raise DeclarationError(str(path), "<file>", "not readable: values nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_file(path: Path, model: type, what: str):
    """One declaration file -> `model`, or DeclarationError/PatchSetErrors naming the file and the field."""
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise DeclarationError(str(path), "<file>", f"expected {what}, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PatchSetErrors(validation_errors(str(path), exc, model)) from None
    except RecursionError:
        raise DeclarationError(str(path), "<file>", "not readable: values nested too deeply") from None
