"""perftrain's operators as Inductor fallbacks, registered once Inductor's lowerings are loaded.

Inductor has no lowering for a custom operator, so on meeting one in a graph it makes an "implicit fallback"
(a call of the operator's own kernel), and before that it formats the operator's arguments for an info log
line whether or not that log is on. An argument's text holds the text of the IR node that made it, and so on
back through the graph: where perftrain's operators feed each other (a DiT's blocks, through the backward)
that text grows with the graph's depth: formatting it for DiT-S/2's backward had not ended after ten minutes. Registering each operator as a fallback before Inductor
lowers a graph (torch._inductor.lowering.make_fallback, with the layout constraint the implicit fallback
would choose) takes that path away; the kernels called are the same.

torch._inductor.lowering takes more than a second to import, longer than a step of perftrain, so importing
perftrain does not import it: install() registers the fallbacks at once where it is loaded already, and
otherwise at the end of its import (a finder on sys.meta_path that wraps the module's loader).
"""
import importlib.abc
import sys
import warnings

import torch

LOWERING = "torch._inductor.lowering"


def operators():
    """Every overload of every perftrain:: operator registered in this process."""
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = name.partition("::")
        if namespace != "perftrain":
            continue
        op_name, _, overload = rest.partition(".")
        found.append(getattr(getattr(torch.ops.perftrain, op_name), overload or "default"))
    return found


def register_fallbacks(lowering):
    """Each perftrain operator that reaches Inductor's lowering and has no lowering yet becomes a fallback, with the layout constraint of its tags
    (the default: fixed stride order), as Inductor's implicit fallback would make it. A failure (another torch
    whose Inductor differs) is a warning: the implicit path still compiles, only slower."""
    try:
        from torch._library.utils import get_layout_constraint_tag
        for op in operators():
            if op in lowering.lowerings or op in lowering.decompositions:
                continue  # lowered already; or decomposed before lowering (the ops that take no tensor)
            constraint = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
            lowering.make_fallback(op, layout_constraint=constraint, warn=False)
    except Exception as e:  # noqa: BLE001  (any failure leaves Inductor's own path)
        warnings.warn(f"perftrain: its operators are not registered as Inductor fallbacks ({e!r}); torch.compile "
                      "still works, but formats each operator's arguments, which is slow on deep graphs")


class _LoaderThenRegister(importlib.abc.Loader):
    """The lowering module's own loader, then register_fallbacks on the loaded module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        register_fallbacks(module)

    def __getattr__(self, name):  # get_source, get_filename, ...: the wrapped loader's
        return getattr(self._loader, name)


class _LoweringFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the lowering module it asks the finders after it, wraps the loader of the spec
    they give, and leaves sys.meta_path (one module, once)."""

    def find_spec(self, name, path, target=None):
        if name != LOWERING:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _LoaderThenRegister(spec.loader)
                return spec
        return None


def install():
    """Registers the fallbacks now where Inductor's lowerings are loaded, else when they are."""
    if LOWERING in sys.modules:
        register_fallbacks(sys.modules[LOWERING])
    elif not any(isinstance(f, _LoweringFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _LoweringFinder())
