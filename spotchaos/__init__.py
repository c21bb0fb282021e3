"""spotchaos: preempt a real training job and fail the build unless it resumes bit-exact.

Kept import-light on purpose: ``spotchaos.probe`` is imported inside training processes and
containers, and importing it runs this file first. The harness API lives in its modules
(``spotchaos.engine``, ``spotchaos.verdict``, ...), imported where needed.
"""

__version__ = "0.1.0"
