"""A module of a subclass made from a module already in a model, taking over its parts.

A fused module subclasses a ``cs336_basics`` module and overrides one method. ``adopt`` builds one from
the module it replaces: the same submodules, Parameter objects and buffers under the same names, in the
same order, and the same settings (``d_model``, ``eps``, ``attention_fn``, ...), so state dicts,
checkpoints, optimizers already holding the parameters and sharding wrappers see the model unchanged.
Nothing is allocated or copied (it works on the meta device too). Hooks on the old module are not
carried over: adopt before wrapping.
"""

from __future__ import annotations

from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)


def adopt(cls: type[M], module: nn.Module) -> M:
    """A new ``cls`` (a subclass of ``type(module)``) holding ``module``'s parts; ``module`` is unchanged."""
    if not (isinstance(cls, type) and issubclass(cls, type(module))):
        raise TypeError(f"cls must be a subclass of {type(module).__name__} to adopt one, got {cls!r}")
    adopted = cls.__new__(cls)
    nn.Module.__init__(adopted)
    for name, value in vars(module).items():
        if not name.startswith("_"):  # settings and the training flag; the registries follow
            setattr(adopted, name, value)
    for name, param in module.named_parameters(recurse=False):
        adopted.register_parameter(name, param)
    for name, buffer in module.named_buffers(recurse=False):
        adopted.register_buffer(name, buffer, persistent=name not in module._non_persistent_buffers_set)
    for name, child in module.named_children():
        adopted.add_module(name, child)
    return adopted
