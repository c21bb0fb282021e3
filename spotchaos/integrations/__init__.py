"""One-line integrations for the frameworks users train with.

Each module imports its framework when it is imported, and only then (Hypothesis's ``extra/``
is the model): ``spotchaos.integrations.transformers`` (a ``TrainerCallback``),
``spotchaos.integrations.lightning`` (a ``Callback`` for ``lightning`` and ``pytorch_lightning``)
and ``spotchaos.integrations.accelerate`` (hooks around ``save_state`` / ``load_state``). Each
speaks the trainer contract through :mod:`spotchaos.probe` and is a no-op outside spotchaos.
"""
