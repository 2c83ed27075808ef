"""policies.records.maker: the instance it makes is the one the class's ``__init__`` makes."""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field

import pytest

from policies.engine.evaluation import Verdict
from policies.facts.review import ReviewInput, UserInfo, from_request
from policies.records import maker


@dataclass(frozen=True)
class Sample:
    name: str
    count: int = 3
    tags: dict[str, str] = field(default_factory=dict)


def test_defaults_and_factories_as_the_class_applies_them() -> None:
    make = maker(Sample)
    made = make(name="a")
    assert made == Sample("a") and made.count == 3 and made.tags == {}
    assert make(name="a").tags is not made.tags  # a fresh value per instance, as the factory
    assert make(name="b", count=7, tags={"x": "y"}) == Sample("b", 7, {"x": "y"})
    assert repr(make(name="a")) == repr(Sample("a"))


def test_still_frozen_and_replaceable() -> None:
    made = maker(Sample)(name="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "b"  # type: ignore[misc]
    assert dataclasses.replace(made, count=9) == Sample("a", 9)
    assert hash(maker(UserInfo)(username="u", groups=("g",), extra=())) == \
        hash(UserInfo(username="u", groups=("g",), extra=()))  # type: ignore[arg-type]


def test_unknown_and_missing_fields_are_refused_as_init_refuses_them() -> None:
    make = maker(Sample)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'name'"):
        make()
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        make(name="a", colour="red")
    with pytest.raises(TypeError):
        make("a")  # keyword-only: a positional slip cannot set the wrong field


def test_classes_whose_init_does_more_are_refused() -> None:
    @dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    @dataclass(frozen=True, slots=True)
    class Slotted:
        value: int

    @dataclass
    class Mutable:
        value: int

    for cls in (Checked, Slotted, Mutable):
        with pytest.raises(TypeError, match=cls.__name__):
            maker(cls)


def test_the_review_and_verdict_made_on_the_admission_path_equal_the_classes_own() -> None:
    request = {"uid": "u", "operation": "CREATE", "namespace": "ml",
               "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "userInfo": {"username": "alice", "groups": ["dev"], "extra": {"k": ["v"]}},
               "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}}
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)
    review = from_request(request, now=now)
    fields = {f.name: getattr(review, f.name) for f in dataclasses.fields(ReviewInput)}
    assert type(review) is ReviewInput and review == ReviewInput(**fields)
    assert review.user == UserInfo("alice", "", ("dev",), {"k": ["v"]})
    assert maker(Verdict)(allowed=True) == Verdict(allowed=True)
