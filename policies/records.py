"""Making instances of frozen dataclasses on the admission path without their ``__init__``.

Owns :func:`maker`: a constructor for a frozen dataclass that sets the instance's ``__dict__``
to one dict display in one call. The ``__init__`` a frozen dataclass is given sets each field
through ``object.__setattr__``, which under CPython 3.11 costs about 2,000 instructions a field
(callgrind): a 14-field :class:`~policies.facts.review.ReviewInput` cost 28 k, the webhook's
12-field ``Decision`` 21 k (8 k made here) — next to 38 k for orjson's decoding of the whole
AdmissionReview. The instance made is the same: every field set (defaults and default factories
applied), still frozen, equal to one made by the class itself.

Must not be used for a class with ``__slots__``, ``__post_init__`` or ``InitVar`` fields (the
maker refuses them: it would skip what they do), nor hold any policy logic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def maker(cls: type[T]) -> Callable[..., T]:
    """A keyword-only constructor of the frozen dataclass ``cls`` (see module docstring).

    The constructor has the signature of the class's ``__init__`` with every argument
    keyword-only: it applies the defaults and default factories of the fields not given, and
    raises :class:`TypeError` for an unknown or missing field, as ``__init__`` does. Like the
    ``__init__`` dataclasses generates, it is compiled from source built from the field names.

    Raises:
        TypeError: ``cls`` is not a frozen dataclass with an instance ``__dict__``, or has a
            ``__post_init__``, ``InitVar`` or non-``__init__`` field (what its ``__init__`` does
            beyond setting fields).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" in vars(cls) or \
            hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: expected a frozen dataclass without __slots__ or "
                        "__post_init__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # a dataclass: checked above
    if any(not f.init or isinstance(f.type, dataclasses.InitVar) for f in fields):
        raise TypeError(f"{cls.__name__}: every field must be an __init__ field")
    scope: dict[str, Any] = {"_new": object.__new__, "_set": object.__setattr__, "_cls": cls,
                             "_FACTORY": _FACTORY}
    arguments, lines = [], []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            scope[f"_default_{f.name}"] = f.default
            arguments.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"_factory_{f.name}"] = f.default_factory
            arguments.append(f"{f.name}=_FACTORY")
            lines.append(f"    if {f.name} is _FACTORY:\n        {f.name} = _factory_{f.name}()")
        else:
            arguments.append(f.name)
    values = ", ".join(f"{f.name!r}: {f.name}" for f in fields)
    source = (f"def make_{cls.__name__}(*, {', '.join(arguments)}):\n" + "".join(
        f"{line}\n" for line in lines) + "    made = _new(_cls)\n"
        f"    _set(made, '__dict__', {{{values}}})\n    return made\n")
    exec(source, scope)  # source built from the dataclass's own field names, as dataclasses does
    make: Callable[..., T] = scope[f"make_{cls.__name__}"]
    make.__qualname__ = make.__name__
    make.__doc__ = f"A {cls.__name__}, fields by name (see policies.records.maker)."
    return make


class _Factory:
    """The default of an argument whose field has a default factory (called when not given)."""

    def __repr__(self) -> str:
        return "<default factory>"


_FACTORY = _Factory()
