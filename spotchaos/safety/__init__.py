"""The trust boundary's helpers: the only way a file the job could have touched is opened
(``safefs``), secrets and their encodings (``redact``), trainer text made inert (``sanitize``)."""
