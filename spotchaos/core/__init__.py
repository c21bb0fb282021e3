"""The session's core: its runs (:mod:`.runs`), the references they are judged against
(:mod:`.references`), the resources they run on (:mod:`.resources`), the shortcuts' rule
(:mod:`.judging`) and the marks that make a method an entry point (:mod:`.entries`)."""

from .entries import Entry, entry_of, query, scenario
from .judging import NONE, Allowed
from .runs import Core, CoreOptions, SessionCore, StorageChaos

__all__ = [
    "NONE",
    "Allowed",
    "Core",
    "CoreOptions",
    "Entry",
    "SessionCore",
    "StorageChaos",
    "entry_of",
    "query",
    "scenario",
]
