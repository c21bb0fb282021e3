"""Scenario families, one module each, on the session core (``spotchaos.session``).

A family is a set of scenarios that change for the same reason: ``preemption`` (plans of notices,
kills and checkpoint damage, judged against the reference), ``crashpoints`` (kills inside the
job's own checkpoint writes and loads), ``budgets`` (checkpoint overhead, notice flush) and
``storage`` (S3 faults and refused credentials). Each is plain functions over a
:class:`~spotchaos.session.Core`; a new family is a new module, not a longer class.
"""
