"""Lazy exports for a package's ``__init__``: each exported name is imported from its
module on first use, so that importing the package (or a torch-free module of it, such
as ``selfrepair.core.numerics``) pulls in no torch."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, sources: dict[str, list[str]], namespace: dict):
    """``(__getattr__, __dir__)`` for ``package``: ``sources`` maps a submodule's name to
    the names it exports; ``namespace`` is the package's ``globals()`` (what it defines
    itself)."""
    where = {name: module for module, names in sources.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    def __dir__():
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
