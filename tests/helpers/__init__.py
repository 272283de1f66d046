"""Helpers shared by test modules: constants, data writers, tiny models and servers that more than
one test module uses (one module per concern). A test module imports shared helpers from here or
from conftest, never from another test module (tests/unit/test_layout.py checks it)."""
