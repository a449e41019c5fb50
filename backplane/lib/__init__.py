"""Helpers below every part: nothing here imports the event log, delivery, integrity or recovery."""
