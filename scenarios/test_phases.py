"""The built-in phase scenario on the bundled ``reference-eval`` job: a SIGTERM and a SIGKILL land
inside its evaluation (``probe.phase("eval")``, 1.5 s, longer than its 1-s grace window), after a
checkpoint and before the first one; the notice must end the evaluation and checkpoint in time.
CI gates it, and a trainer that finishes its evaluation first, in tests/test_phases.py.

On a job of your own: mark its phases (``with probe.phase("eval"): ...``), declare
``phases = ["eval"]`` and run ``pytest --spotchaos --spotchaos-job NAME --pyargs
spotchaos.scenarios.test_preemption -k phase``.
"""

import pytest

from spotchaos.scenarios.test_preemption import test_a_fault_inside_each_phase_then_resume_is_bit_exact  # noqa: F401

pytestmark = [pytest.mark.spotchaos(jobs=["reference-eval"]), pytest.mark.full]
