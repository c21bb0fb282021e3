"""The keys under which a ``--spotchaos`` session keeps its state on pytest's objects.

In a module of their own so that the plugin, the session and the fixture object each import them
without importing one another (pytest's ``StashKey`` rather than private attributes).
"""

from __future__ import annotations

from typing import Any

import pytest

STATE = pytest.StashKey[Any]()  # on the config: the session's state (pytest_session._State) under --spotchaos
RECORDS = pytest.StashKey[list[Any]]()  # on a test item: its scenario records (record.ScenarioRecord)
