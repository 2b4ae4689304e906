"""Test suites that every implementation of a contract runs (engines, stores), importable by plug-ins too."""
