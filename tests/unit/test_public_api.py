"""The public API is pinned: what ``__all__`` promises exists, and nothing public is missing."""

from __future__ import annotations

import types

import pytest

import cardfence
from cardfence import store
from cardfence.engine import errors
from cardfence.engine.auth import config as credentials_config
from cardfence.engine.auth import credentials
from cardfence.engine.cards import interfaces, keys, model, signature_policy, signatures
from cardfence.engine.core import answers
from cardfence.engine.wire import v10 as remote

# Modules split along a seam: the old ones (signatures, credentials, model, remote) re-export what
# moved.
SPLIT = [
    credentials,
    credentials_config,
    signatures,
    signature_policy,
    keys,
    model,
    interfaces,
    remote,
    answers,
]


@pytest.mark.parametrize("module", [cardfence, errors, store, *SPLIT], ids=lambda m: m.__name__)
def test_all_is_sorted_and_every_name_exists(module: types.ModuleType) -> None:
    names = module.__all__
    # isort style, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then the rest.
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    for name in names:
        assert hasattr(module, name), name


@pytest.mark.parametrize("module", [cardfence, store], ids=lambda m: m.__name__)
def test_every_public_name_is_exported(module: types.ModuleType) -> None:
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(module.__all__)


def test_every_error_derives_from_the_one_root() -> None:
    for name in errors.__all__:
        error = getattr(errors, name)
        assert issubclass(error, cardfence.CardfenceError), name


def test_the_error_tree_is_drawn_in_the_module_docstring() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        assert name in doc, f"{name} missing from the drawn tree"
