"""What ``--spotchaos`` turns on in pytest: the session (options, built-in scenarios, report, summary),
the fixture object, the stash keys and the hook specifications users implement. The only package
besides ``spotchaos.plugin`` that imports pytest."""
