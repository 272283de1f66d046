"""Moved public names (juice.moved): the old path gives the very object of the new home, with a
DeprecationWarning that names the new home and points at the line that used the old path."""

from __future__ import annotations

import importlib
import sys

import pytest

from juice.moved import MOVED_MODULES, MOVED_NAMES


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_path_is_the_new_module_with_a_warning(old):
    new = importlib.import_module(MOVED_MODULES[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED_MODULES[old]}") as caught:
        module = __import__(old, fromlist=["_"])   # as an import statement does
    assert module is new
    assert caught[0].filename == __file__


@pytest.mark.parametrize("old, name", sorted(MOVED_NAMES))
def test_an_old_name_is_the_new_homes_object_with_a_warning(old, name):
    new = importlib.import_module(MOVED_NAMES[old, name])
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {MOVED_NAMES[old, name]}.{name}") as caught:
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(new, name)
    assert caught[0].filename == __file__


def test_a_name_that_never_was_there_is_still_an_attribute_error():
    import juice.auto

    with pytest.raises(AttributeError, match="no attribute 'tune_everything'"):
        juice.auto.tune_everything   # noqa: B018


def test_the_new_homes_define_what_the_table_says():
    for (old, name), new in MOVED_NAMES.items():
        assert name in importlib.import_module(new).__all__
        assert name not in importlib.import_module(old).__all__
