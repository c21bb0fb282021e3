"""Repository-level conftest: the spotchaos plugin itself is loaded through its entry point."""

pytest_plugins = ["pytester"]
