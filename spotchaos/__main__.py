"""``python -m spotchaos``: the ``spotchaos`` command, for an environment whose scripts folder is
not on PATH (a venv used without activating it)."""

import sys

from .cli import main

sys.exit(main())
