"""The training-job pipeline, laid out as a run flows: ``engine/`` runs a job under a plan (attempts,
the step hold, where a fault landed); ``events``, ``logadapter`` and ``trajectory`` turn what the job
did into a record; ``verdict``, ``determinism``, ``restarts`` and ``frameworks`` judge it; ``state/``
compares what its checkpoints hold; ``multirank/`` carries the same through torchrun and Ray Train."""
