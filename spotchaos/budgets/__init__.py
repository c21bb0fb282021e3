"""What checkpointing costs: the overhead measured from a run's events, the interval advice, the
cost of a completed job."""
