"""Request validators compiled from the API's DRF serializers, for the agent routes (api/routes.py).

The serializers stay the one source of truth: they generate the OpenAPI document, and this
module reads their declared fields once, at import, and compiles a plain function that accepts
exactly the bodies the serializer accepts *without any change to them* (no whitespace trimmed,
no coercion). Anything else — an error, or a body the serializer would normalise — returns
None, and the caller runs the serializer itself, which gives the contract's error (or the
normalised data). So the fast check can only be stricter than the serializer, never looser,
and tests/api/test_fastcheck.py holds it to that on generated bodies.

A serializer with a field or validator this compiler does not know fails at import, so a new
field cannot slip past the agent routes unchecked.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from django.core import validators as django_validators
from rest_framework import fields as drf_fields
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from api.serializers import (
    JSONObjectField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    StrictUUIDField,
)

# What a compiled check returns for "not accepted as is": the caller asks the serializer.
Check = Callable[[Any], Any]
_DOUBT = object()

# Validators a field's own attributes already express (lengths, bounds), or that the strict JSON
# parser has made moot (NUL, surrogates: refused before any field sees a string). Checked anyway.
_LENGTH_AND_BOUND_VALIDATORS = (
    django_validators.MaxLengthValidator,
    django_validators.MinLengthValidator,
    django_validators.MaxValueValidator,
    django_validators.MinValueValidator,
    django_validators.ProhibitNullCharactersValidator,
    ProhibitSurrogateCharactersValidator,
)


class NotCompilable(TypeError):
    """A serializer uses something this compiler cannot reproduce exactly."""


def _regexes(field: serializers.Field) -> list[re.Pattern[str]]:
    found = []
    for validator in field.validators:
        if isinstance(validator, django_validators.RegexValidator) and not validator.inverse_match:
            regex = validator.regex
            found.append(regex if isinstance(regex, re.Pattern) else re.compile(regex, validator.flags))
        elif not isinstance(validator, _LENGTH_AND_BOUND_VALIDATORS):
            raise NotCompilable(f"{field.field_name}: validator {type(validator).__name__} is not supported")
    return found


def _char_check(field: StrictCharField) -> Check:
    allow_null = field.allow_null
    max_length = field.max_length
    # A blank string is refused unless allowed; min_length applies on top.
    min_length = max(field.min_length or 0, 0 if field.allow_blank else 1)
    trims = field.trim_whitespace
    patterns = _regexes(field)

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        if type(value) is not str or len(value) < min_length or (max_length is not None and len(value) > max_length):
            return _DOUBT
        if (trims and value != value.strip()) or "\x00" in value:
            return _DOUBT
        for pattern in patterns:
            if pattern.search(value) is None:
                return _DOUBT
        return value

    return check


def _integer_check(field: StrictIntegerField) -> Check:
    allow_null = field.allow_null
    low, high = field.min_value, field.max_value
    _regexes(field)  # only bound validators are allowed

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        if type(value) is not int or (low is not None and value < low) or (high is not None and value > high):
            return _DOUBT
        return value

    return check


# The form a UUID is printed in (lowercase, hyphenated): the one the fast check takes as is.
_CANONICAL_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _uuid_check(field: serializers.UUIDField) -> Check:
    allow_null = field.allow_null
    _regexes(field)

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        # The serializer's validated value is a UUID object: the same one, from the same text.
        return uuid.UUID(value) if type(value) is str and _CANONICAL_UUID.match(value) else _DOUBT

    return check


def _object_check(field: JSONObjectField) -> Check:
    allow_null = field.allow_null
    _regexes(field)

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        return value if type(value) is dict else _DOUBT

    return check


def _boolean_check(field: StrictBooleanField) -> Check:
    allow_null = field.allow_null
    _regexes(field)

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        return value if type(value) is bool else _DOUBT

    return check


def _list_within(value: Any, allow_empty: bool | None, min_length: int | None, max_length: int | None) -> bool:
    """A JSON array the list's emptiness and length bounds allow."""
    if type(value) is not list or (not value and not allow_empty):
        return False
    return (max_length is None or len(value) <= max_length) and (min_length is None or len(value) >= min_length)


def _list_check(field: serializers.ListSerializer) -> Check:
    assert isinstance(field.child, StrictSerializer)
    child = _serializer_check(type(field.child))
    allow_null, allow_empty = field.allow_null, field.allow_empty
    # DRF 3.14's length bounds of a list serializer (absent from the type stubs).
    max_length, min_length = getattr(field, "max_length", None), getattr(field, "min_length", None)

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        if not _list_within(value, allow_empty, min_length, max_length):
            return _DOUBT
        items = []
        for item in value:
            checked = child(item)
            if checked is _DOUBT:
                return _DOUBT
            items.append(checked)
        return items

    return check


def _choice_check(field: serializers.ChoiceField) -> Check:
    allow_null = field.allow_null
    # Only choices that are their own string: DRF maps str(value) to the choice.
    choices = frozenset(text for text, value in field.choice_strings_to_values.items() if text == value)
    _regexes(field)

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        return value if type(value) is str and value in choices else _DOUBT

    return check


def _string_list_check(field: serializers.ListField) -> Check:
    if type(field.child) is not StrictCharField:
        raise NotCompilable(f"{field.field_name}: a list of {type(field.child).__name__} is not supported")
    child = _char_check(field.child)
    allow_null, allow_empty = field.allow_null, field.allow_empty
    max_length, min_length = field.max_length, field.min_length

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        if not _list_within(value, allow_empty, min_length, max_length):
            return _DOUBT
        items = [child(item) for item in value]
        return _DOUBT if any(item is _DOUBT for item in items) else items

    return check


def _nested_check(field: StrictSerializer) -> Check:
    nested = _serializer_check(type(field))
    allow_null = field.allow_null

    def check(value: Any) -> Any:
        if value is None:
            return None if allow_null else _DOUBT
        return nested(value)

    return check


def _field_check(field: serializers.Field) -> Check:
    if field.read_only or field.default is not drf_fields.empty or field.source != field.field_name:
        raise NotCompilable(f"{field.field_name}: read-only fields, defaults and sources are not supported")
    if isinstance(field, serializers.ListSerializer) and isinstance(field.child, StrictSerializer):
        return _list_check(field)
    if isinstance(field, StrictSerializer):
        return _nested_check(field)
    if type(field) is serializers.ListField:
        return _string_list_check(field)
    if type(field) is serializers.ChoiceField:
        return _choice_check(field)
    if type(field) is StrictCharField:
        return _char_check(field)
    if type(field) is StrictIntegerField:
        return _integer_check(field)
    if type(field) is JSONObjectField:
        return _object_check(field)
    if type(field) is StrictUUIDField:
        return _uuid_check(field)
    if type(field) is StrictBooleanField:
        return _boolean_check(field)
    raise NotCompilable(f"{field.field_name}: {type(field).__name__} is not supported")


def _serializer_check(serializer_class: type[StrictSerializer]) -> Check:
    if serializer_class.validate is not serializers.Serializer.validate or any(
        name.startswith("validate_") for name in vars(serializer_class)
    ):
        raise NotCompilable(f"{serializer_class.__name__} has validate methods")
    fields = serializer_class().fields
    checks = {name: _field_check(field) for name, field in fields.items()}
    required = frozenset(name for name, field in fields.items() if field.required)

    def check(data: Any) -> Any:
        if type(data) is not dict or not required.issubset(data):
            return _DOUBT
        validated = {}
        for name, value in data.items():
            field_check = checks.get(name)
            if field_check is None:  # an unknown field: the serializer names it
                return _DOUBT
            checked = field_check(value)
            if checked is _DOUBT:
                return _DOUBT
            validated[name] = checked
        return validated

    return check


def compile_check(serializer_class: type[StrictSerializer]) -> Callable[[Any], dict[str, Any] | None]:
    """The serializer's validated data for a body it accepts unchanged; None for anything else."""
    check = _serializer_check(serializer_class)

    def accepted_as_is(data: Any) -> dict[str, Any] | None:
        checked = check(data)
        return None if checked is _DOUBT else checked

    accepted_as_is.__name__ = f"accepted_as_is_by_{serializer_class.__name__}"
    return accepted_as_is
