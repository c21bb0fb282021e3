"""The built-in service scenario, for every service declared in ``[tool.spotchaos.services.NAME]``:
the reclaim notice under load. Every request in flight at the notice answered in full, none sent
after it dropped (refused, or 503 with Retry-After, is fine), readiness failing within
``unready_within_seconds`` of the notice, the drain over before the kill; with ``instance_types``
the replacement serving on the first type of the fallback order that has capacity, with ``model``
from a warm cache that is never stale.

Run it on a service of your own by name::

    pytest --spotchaos --spotchaos-job my-service --pyargs spotchaos.scenarios.test_serving
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spotchaos


def test_the_service_drains_through_its_reclaim_notice(spotchaos, spotchaos_service):
    spotchaos.check_drain(spotchaos_service)
