"""Data references: which of a client's data an operation uses.

A protocol never holds a client's data: it names it (the training set up to a session, a
test split, ...), and the client's `Site` resolves the name on its own data. A name is a
small frozen dataclass, a subclass of `DataRef` per kind, declared by the study whose sites
resolve it (e.g. the pain study's `TrainingSet(seed=5, upto=2)`), with plain fields (int,
str). In process a reference goes to the site as it is; to a Flower site and in a
coordinator's checkpoint it travels in its plain form, a JSON-ready dict (`plain`), which the
site turns back into its own kinds (`from_plain`, refusing anything else). Never pickled.

Two kinds are shared by the studies: `Split`, a named split of a client's data ("train",
"test") for the sites that hold fixed splits, and `SeededSplit`, one drawn per run seed.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

PLAIN_TYPES = (int, str)  # what a reference's fields may be: JSON keeps them exactly


class DataRefError(ValueError):
    """A reference a site cannot resolve: an unknown kind, or fields of the wrong names or types."""


@dataclass(frozen=True)
class DataRef:
    """Names some of one client's data; a subclass per kind sets `kind` and its fields."""

    kind: ClassVar[str]

    def plain(self) -> dict[str, Any]:
        """The reference as a JSON-ready dict: {"kind": ..., field: value, ...}."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in values.items():
            if type(value) not in PLAIN_TYPES:  # e.g. a numpy integer: JSON would refuse or change it
                raise TypeError(f"{type(self).__name__}.{name} = {value!r}: a reference's fields are int or str")
        return {"kind": self.kind, **values}

    @staticmethod
    def from_plain(plain: Any, kinds: Iterable[type[DataRef]]) -> DataRef:
        """The reference `plain` describes, as one of `kinds` (a site's own); `DataRefError` if
        it is none of them, or its fields are not exactly that kind's, with their types."""
        by_kind = {k.kind: k for k in kinds}
        kind = plain.get("kind") if isinstance(plain, dict) else None
        if kind not in by_kind:
            raise DataRefError(f"unknown data reference {plain!r} (this site knows {', '.join(sorted(by_kind))})")
        cls = by_kind[kind]
        values = {k: v for k, v in plain.items() if k != "kind"}
        types = _field_types(cls)
        if set(values) != set(types) or any(type(values[k]) is not t for k, t in types.items()):
            raise DataRefError(f"data reference {plain!r}: a {kind!r} reference has the fields "
                               f"{', '.join(f'{k} ({t.__name__})' for k, t in types.items())}")
        return cls(**values)

    def __str__(self) -> str:
        """For people (a record of what a site missed): "train/5/2"; never parsed back."""
        return "/".join([self.kind, *(str(getattr(self, f.name)) for f in fields(self))])


@functools.cache
def _field_types(cls: type[DataRef]) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    types = {f.name: hints[f.name] for f in fields(cls)}
    bad = [name for name, t in types.items() if t not in PLAIN_TYPES]
    if bad:
        raise TypeError(f"{cls.__name__}: fields {bad} must be int or str to travel")
    return types


@dataclass(frozen=True)
class Split(DataRef):
    """A named split of a client's data ("train", "test", "eval"), for sites with fixed splits."""

    kind: ClassVar[str] = "split"
    name: str


@dataclass(frozen=True)
class SeededSplit(DataRef):
    """A named split of a client's data as drawn for run seed `seed` (its "train" and "test")."""

    kind: ClassVar[str] = "seeded"
    name: str
    seed: int

