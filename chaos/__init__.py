"""The chaos runner and the history schema (see docs/chaos.md)."""
