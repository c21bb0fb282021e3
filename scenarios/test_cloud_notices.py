"""The reclaim notice as a cloud posts it on its instance metadata, with no SIGTERM: AWS
spot/instance-action (IMDSv2), GCP instance/preempted, Azure Scheduled Events, Alibaba
spot/termination-time, each served by the harness on 127.0.0.1 for the attempt. Many trainers poll
the metadata instead of handling SIGTERM; this gate holds them to the same bit-exact resume.

Add your own job to the marker's list once it reads the metadata of the clouds it runs on.
"""

from __future__ import annotations

import pytest

from spotchaos.strategies import preemption_plans

# the workers variant reads the notice the same way; CI: tests/test_reference_trainer.py posts all four notices
pytestmark = [pytest.mark.spotchaos(jobs=["reference"]), pytest.mark.full]

CLOUD_NOTICES = ("aws-notice", "gcp-notice", "azure-notice", "alibaba-notice")


def test_cloud_notice_then_resume_is_bit_exact(spotchaos, spotchaos_job):
    """One or two notices read from the instance metadata: checkpoint inside the window, exit, resume bit-exact."""
    spotchaos.explore(spotchaos_job, lambda steps: preemption_plans(steps, faults=CLOUD_NOTICES, max_preemptions=2))
