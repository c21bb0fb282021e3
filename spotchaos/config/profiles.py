"""How many plans a scenario tries, by profile: a constant the pytest options need at start-up,
kept apart so reading it imports nothing else."""

PROFILES: dict[str, int] = {"quick": 2, "standard": 4, "thorough": 12}
"""Hypothesis examples (plans) per scenario and job for each profile."""
