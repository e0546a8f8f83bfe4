"""Data files of the evaluation harness (a package so that setuptools ships the JSON)."""
