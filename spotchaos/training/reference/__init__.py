"""The reference run, trained once and used again: its checkpoints copied for plans to start from
(``prefix``), and the whole of it kept across sessions (``cache``)."""
