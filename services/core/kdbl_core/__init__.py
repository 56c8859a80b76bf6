"""Shared core of K-Lake: settings, errors, logging, database, auth, search."""

__version__ = "0.1.0"
