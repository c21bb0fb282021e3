"""The gallery's stand-ins (docs/gallery.md), gated as users bring them: the built-in preemption
scenarios on ``resume-from-path``, a script handed its newest checkpoint on the command line
(``{latest_checkpoint}``), with no wrapper. CI drives it in tests/test_placeholders.py.
"""

import pytest

from spotchaos.scenarios.test_preemption import (  # noqa: F401
    test_chained_preemptions_are_bit_exact,
    test_hard_kill_then_resume_is_bit_exact,
    test_notice_then_resume_is_bit_exact,
)

pytestmark = [pytest.mark.spotchaos(jobs=["resume-from-path"]), pytest.mark.full]
