"""Tiffany: durable agent-task orchestration on a generator kernel."""

__version__ = "0.1.0"
