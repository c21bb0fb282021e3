"""One run of a job under one plan: ``run`` (attempts, their watch and teardown), ``hold`` (the job
held after the planned step until its fault is delivered), ``landing`` (where a fault really landed)."""
