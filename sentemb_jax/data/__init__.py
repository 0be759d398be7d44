"""Data: locating the data directory and reading its files."""
