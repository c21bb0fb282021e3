"""Services on spot: the reclaim notice under load. Every request in flight at the notice must be
answered in full, none sent after it dropped (refused or 503 with Retry-After is fine), and the
drain must be over before the kill; the replacement must serve on the first available type of the
fallback order, from a warm model cache that is never stale. The services are declared in pyproject.toml."""

import pytest

SERVICES = ["model", "model-stream", "model-aws", "model-fallback", "model-republished", "model-pai-eas"]


@pytest.mark.parametrize("name", SERVICES)
def test_the_service_drains_through_its_reclaim_notice(spotchaos, name):
    spotchaos.check_drain(name)
