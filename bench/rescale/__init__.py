"""bench/rescale.py's parts: one module per job (see README.md); the helper scripts run as files."""
