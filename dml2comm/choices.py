"""The base of dml2comm's closed sets of flag and label values (stdlib only, so every layer may use it).

A closed set -- a flag's choices (``--cp-scheme``, ``--optimizer``), a layer's kind, a simulated
stream, a topology key -- is a :class:`Choice` enum: the code compares its members by identity, and
since a member *is* a ``str`` equal to its value, data.json, CSV rows and printed lines are unchanged.
``tests/test_closed_sets.py`` keeps raw-string comparisons against these values out of the code.
"""

from __future__ import annotations

import enum

__all__ = ["Choice"]


class Choice(str, enum.Enum):
    """A closed set of flag values: a ``str`` (it equals, hashes and prints as its flag value,
    so data.json and messages are unchanged) that the code compares by identity."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def of(cls, value):
        """The member for ``value`` (a member already, or its flag value) by one dict look-up:
        ``cls(value)`` goes through ``EnumType.__call__``, which a sweep pays once per set per
        configuration.  Anything else raises as ``cls(value)`` does."""
        member = cls._value2member_map_.get(value)
        return member if member is not None else cls(value)
