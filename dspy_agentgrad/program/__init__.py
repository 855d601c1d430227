"""The user's program as the optimizer sees it: traced and replayed runs, scored evaluation, hints, the metric."""
