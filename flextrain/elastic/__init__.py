"""Elastic batch semantics shared by master and workers (planning, state transfer)."""
