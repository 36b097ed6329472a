"""Validation shared by every YAML we read (job specs, node inventories): strict mappings,
whole numbers that YAML cannot sneak past as booleans or floats, and one-line errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError


def fail(error_type: str, template: str, **values: Any) -> PydanticCustomError:
    """A validation error whose message is formatted here (pydantic would not apply `!r`)."""
    return PydanticCustomError(error_type, template.format(**values))


def count(minimum: int, maximum: int | None = None):
    """A whole number in a range; YAML `true` and `2.5` are refused, not coerced."""
    valid = f"{minimum} or {maximum}" if maximum == minimum + 1 else f"a whole number >= {minimum}"
    if maximum is not None and maximum > minimum + 1:
        valid = f"a whole number from {minimum} to {maximum}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("count", "expected " + valid)
        if value < minimum or (maximum is not None and value > maximum):
            raise fail("count", "expected " + valid)
        return value

    return Annotated[int, BeforeValidator(check)]


Port = count(1, 65535)


class StrictSection(BaseModel):
    """A mapping whose unknown keys are errors that list the valid ones."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise fail("mapping", "expected a mapping of keys to values")
        if cls.model_config.get("extra") != "forbid":
            return data
        valid = [f.alias or name for name, f in cls.model_fields.items()]
        for key in data:
            if key not in valid:
                close = difflib.get_close_matches(str(key), valid, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(
                    "unknown_key",
                    "unknown key {key!r}{hint}; valid keys: {valid}",
                    key=key,
                    hint=hint,
                    valid=", ".join(valid),
                )
        return data


def _location(loc: tuple[Any, ...], drop_parts: Iterable[str]) -> str:
    dropped = set(drop_parts)
    # Pydantic names the function of a BeforeValidator in some locations; drop those too.
    parts = [str(p) for p in loc if p not in dropped and not str(p).startswith("function-")]
    return ".".join(parts)


def one_line(
    exc: ValidationError, drop_parts: Iterable[str] = (), whole_prefixes: tuple[str, ...] = ()
) -> str:
    """The first error as one line: where, the value, and what would be valid.

    `drop_parts`: location parts to leave out (a union's tag); `whole_prefixes`: messages
    that already say where they are."""
    err = exc.errors(include_url=False)[0]
    where = _location(err["loc"], drop_parts)
    kind, message, value = err["type"], err["msg"], err.get("input")
    if whole_prefixes and message.startswith(whole_prefixes):
        return message
    if kind in ("unknown_key", "env_reserved", "env_name", "output_path", "output", "script"):
        return f"{where}: {message}" if where else message
    if kind == "literal_error":
        expected = message.removeprefix("Input should be ").replace("'", "")
        return f"{where}: {value!r} is not valid; expected {expected}"
    if kind in ("string_type", "list_type", "dict_type", "bool_type"):
        what = {
            "string_type": "a string",
            "list_type": "a list",
            "dict_type": "a mapping",
            "bool_type": "true or false",
        }[kind]
        return f"{where}: {value!r} is not valid; expected {what}"
    if kind == "missing":
        return f"{where}: missing"
    if value is not None and not isinstance(value, dict):
        return f"{where}: {value!r} is not valid; {message}"
    return f"{where}: {message}" if where else message


# -- reading YAML we were given --------------------------------------------------------------

# Processes on one node, however a spec says it (the proposal's dialect reads a command's
# --nproc_per_node too): far above what one machine runs.
MAX_PROCS_PER_NODE = 1024
MAX_YAML_BYTES = 4 << 20  # a spec with a notebook cell in it is far smaller
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 200_000  # counted with every alias expanded: a "billion laughs" stops here
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where present: fast


class YamlTooBig(ValueError):
    """YAML that is too large, too deep, expands too far or refers to itself."""


def read_yaml_file(path: Path) -> str:
    """A YAML file's text, read no further than MAX_YAML_BYTES (a spec named /dev/zero, or
    a huge file, fails at once with YamlTooBig instead of filling memory first).
    OSError and UnicodeDecodeError as reading raises them."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_YAML_BYTES + 1)
    if len(data) > MAX_YAML_BYTES:
        raise YamlTooBig(f"more than {MAX_YAML_BYTES >> 20} MiB of YAML")
    return data.decode("utf-8")


def load_yaml(text: str) -> Any:
    """`text` as YAML with its size, nesting and alias expansion bounded (YamlTooBig, one
    line), and no value that a process could not be given (a NUL byte, a lone surrogate).
    yaml.YAMLError for text that is not YAML."""
    if len(text) > MAX_YAML_BYTES:
        raise YamlTooBig(f"{len(text) >> 20} MiB of YAML; at most {MAX_YAML_BYTES >> 20} MiB")
    try:
        node = yaml.compose(text, Loader=_Loader)
    except RecursionError:
        raise YamlTooBig(f"nested deeper than {MAX_YAML_DEPTH} levels") from None
    if node is None:
        return None
    _check_node(node)
    return yaml.load(text, Loader=_Loader)  # a safe loader: CSafeLoader or SafeLoader


def _check_node(root: yaml.Node) -> None:
    """Depth, expanded size and cycles of a composed document, without recursion."""
    seen = 0
    stack: list[tuple[yaml.Node, int, frozenset[int]]] = [(root, 1, frozenset())]
    while stack:
        node, depth, above = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise YamlTooBig(
                f"more than {MAX_YAML_NODES} values once its aliases are expanded (an alias bomb?)"
            )
        if depth > MAX_YAML_DEPTH:
            raise YamlTooBig(f"nested deeper than {MAX_YAML_DEPTH} levels")
        if id(node) in above:
            raise YamlTooBig("an alias refers to a value that holds it (a cycle)")
        if isinstance(node, yaml.ScalarNode):
            _check_text(node.value)
            continue
        inner = above | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            stack += [(child, depth + 1, inner) for child in node.value]
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack += [(key, depth + 1, inner), (value, depth + 1, inner)]


def _check_text(value: str) -> None:
    if "\x00" in value:
        raise YamlTooBig(f"{_shown(value)} holds a NUL byte, which no process can be given")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise YamlTooBig(f"{_shown(value)} holds a lone surrogate (not UTF-8)") from None


def _shown(value: str) -> str:
    text = value if len(value) <= 30 else value[:30] + "..."
    return repr(text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))


def check_values(data: Any) -> None:
    """Every string in `data` (keys too) can be given to a process (YamlTooBig if not);
    data from elsewhere than YAML (a magic's options, the form) passes the same check."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            stack += list(item)
