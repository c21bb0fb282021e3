"""Jobs of several ranks: the launchers (torchrun, Ray Train: launchers, not backends), the ranks of
one attempt as one handle, and what only the ranks other than 0 show."""
