"""Warm starts: a job's heavy imports paid once per session (see pool.py and zygote.py)."""
