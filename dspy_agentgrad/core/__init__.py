"""The algorithm: the round loop and its stop rules (engine), steps 1-2 (attribution), steps 3-4 (abstraction),
step 5 (acceptance), speculation, the run's state and its events."""
