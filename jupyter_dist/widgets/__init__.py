"""Notebook widgets: thin views over a job (they read its events and the store)."""
