"""What every run needs underneath: budget, paid work and its journal, retries, threads, usage, locks, prices."""
