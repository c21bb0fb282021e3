"""The built-in scenarios: every job declared for spotchaos gets them under ``pytest --spotchaos``.

They ship in the package, so a project that installs spotchaos and declares a job has the whole
gate without copying a file: the plugin adds this folder to what pytest collects (unless the run
names test files of its own, or ``[tool.spotchaos] builtin = false``). Each module is an ordinary
pytest module; copy one to start a scenario of your own.
"""
