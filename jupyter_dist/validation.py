"""Validation shared by every YAML we read (job specs, node inventories): strict mappings,
whole numbers that YAML cannot sneak past as booleans or floats, and one-line errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Annotated, Any

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
    if kind in ("unknown_key", "env_reserved", "env_name"):
        return f"{where}: {message}" if where else message
    if kind == "literal_error":
        expected = message.removeprefix("Input should be ").replace("'", "")
        return f"{where}: {value!r} is not valid; expected {expected}"
    if kind in ("string_type", "list_type", "dict_type"):
        what = {"string_type": "a string", "list_type": "a list", "dict_type": "a mapping"}[kind]
        return f"{where}: {value!r} is not valid; expected {what}"
    if kind == "missing":
        return f"{where}: missing"
    if value is not None and not isinstance(value, dict):
        return f"{where}: {value!r} is not valid; {message}"
    return f"{where}: {message}" if where else message
