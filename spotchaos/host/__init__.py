"""This machine as the harness sees it: processes by identity, what a dead session left, GPUs and
their leases, free loopback ports."""
