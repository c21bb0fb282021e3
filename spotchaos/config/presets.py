"""Provider facts users pick by name instead of looking them up.

Grace windows are the notice each provider documents before it reclaims a spot instance. The
mean-time-between-preemption presets are planning assumptions, not provider figures: no
provider publishes one, and the real rate varies by region, instance type and hour. Measure
yours and set ``mtbf_seconds`` when you can.
"""

from __future__ import annotations

GRACE_WINDOWS: dict[str, float] = {
    "aws": 120.0,  # EC2 spot interruption notice: two minutes
    "gcp": 30.0,  # Compute Engine spot / preemptible VMs
    "azure": 30.0,  # Azure spot VMs (Scheduled Events)
    "alibaba-pai-eas": 300.0,  # PAI-EAS spot: about five minutes before reclaim
    "kubernetes": 30.0,  # terminationGracePeriodSeconds default
}

MTBF_PRESETS: dict[str, float] = {
    "pessimistic": 1 * 3600.0,
    "typical": 6 * 3600.0,
    "optimistic": 24 * 3600.0,
}
