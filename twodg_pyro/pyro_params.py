r"""How the library's models and guides meet Pyro's parameter machinery.

A guide (and a model, for its deterministic parameters such as BatchNorm's) is a
``torch.nn.Module`` whose Pyro program (its ``forward``) starts with one ``pyro.param``
statement per trainable parameter, named ``"<pyro_name>.<parameter name>"`` (e.g.
``"MeanFieldGuide.locs.layers__0__weight"``).  So stock Pyro inference sees them:

* in Pyro's default (global) parameter mode the param store holds **the module's own
  tensors** (the same objects), so ``pyro.infer.SVI`` with a ``pyro.optim`` optimiser
  trains them and ``pyro.get_param_store().save(...)`` captures them;
* under ``pyro.settings.set(module_local_params=True)`` the statements are emitted
  without touching the store, as :class:`pyro.nn.PyroModule` does, so ``SVI`` still
  finds and trains them.

The library's own loop does not pay for this: inside :func:`local_params` (entered by
:meth:`~twodg_pyro.infer.DecomposedELBO.loss_terms`, hence by
:func:`~twodg_pyro.infer.fit` and the distributed loop) the programs emit no param
statements and no bookkeeping sites, and the store is never read or written.

**Mixing the two.**  ``fit`` steps and ``SVI`` steps update the same tensors, in any
order.  When a program runs in global mode and the store already holds a *different*
tensor under one of its names:

* a tensor that another of this library's modules put there (an earlier guide with
  the same ``pyro_name``, or a parameter the guide itself has since replaced, e.g. by a
  merge) is replaced by the module's own: each module trains its own parameters;
* a tensor put there by other means (``pyro.get_param_store().load(...)``,
  ``pyro.param``) wins, as for any Pyro module: its values are copied into the
  module's parameter (a ``UserWarning`` names them), which then takes its place in the
  store; a shape that differs is a ``ValueError``.

``fit`` and ``predict`` never look at the store: after loading a saved store, call
:meth:`PyroParamsMixin.sync_param_store` (or run the program once) before using them.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import pyro
import torch
from pyro.distributions import constraints
from pyro.poutine.runtime import _PYRO_STACK, effectful, get_plates

_LOCAL: ContextVar[bool] = ContextVar("twodg_pyro_local_params", default=False)
#: tensors put in the param store by this library's modules: id -> tensor (weakly held)
_OWNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@contextmanager
def local_params(enabled: bool = True) -> Iterator[None]:
    """Within the block, the library's models and guides emit no ``pyro.param``
    statements and no bookkeeping sites (the ``logits`` site): the fast path of
    :func:`~twodg_pyro.infer.fit`.  Their parameters are used as the module holds them."""
    token = _LOCAL.set(bool(enabled))
    try:
        yield
    finally:
        _LOCAL.reset(token)


def params_are_local() -> bool:
    """Whether the library's programs skip their param statements (see :func:`local_params`)."""
    return _LOCAL.get()


def handlers_active() -> bool:
    """Whether any Pyro effect handler is active (e.g. ``SVI``'s parameter capture)."""
    return bool(_PYRO_STACK)


def plate_batch_shape() -> tuple[int, ...]:
    """The batch shape that the enclosing vectorised plates ask of a global site: ``()``
    outside plates; ``(S,)`` in ``Predictive(parallel=True)``'s plate over a guide;
    ``(S, 1)`` in a particle plate at ``dim=-2`` (``Trace_ELBO(vectorize_particles=True,
    max_plate_nesting=1)``)."""
    frames = [f for f in get_plates() if f.dim is not None]
    if not frames:
        return ()
    shape = [1] * max(-f.dim for f in frames)
    for f in frames:
        shape[f.dim] = f.size
    return tuple(shape)


def _sync(prefix: str, full_named: list[tuple[str, torch.Tensor]]) -> list[str]:
    store = pyro.get_param_store()
    adopted = []
    for full, p in full_named:
        held = store._params.get(full)
        if held is p:
            continue
        if held is not None:
            if _OWNED.get(id(held)) is not held:  # loaded, or made by pyro.param
                value = store[full]  # constrained, as the user sees it
                if tuple(value.shape) != tuple(p.shape):
                    raise ValueError(
                        f"Pyro's param store holds {full!r} with shape {tuple(value.shape)}, "
                        f"but the parameter of that name has shape {tuple(p.shape)}: the "
                        "store holds another program's parameters under this name; call "
                        "pyro.clear_param_store() or set another pyro_name on the module"
                    )
                with torch.no_grad():
                    p.copy_(value.detach())
                adopted.append(full)
            store._param_to_name.pop(held, None)
        store._params[full] = p
        store._constraints[full] = constraints.real
        store._param_to_name[p] = full
        _OWNED[id(p)] = p
    if adopted:
        more = f" and {len(adopted) - 3} more" if len(adopted) > 3 else ""
        warnings.warn(
            f"{prefix}: {len(adopted)} parameter(s) took their values from Pyro's param store "
            f"({', '.join(adopted[:3])}{more}), where they were put by other means than "
            "this library (e.g. pyro.get_param_store().load); call pyro.clear_param_store() "
            "first to keep the module's own values",
            UserWarning,
            stacklevel=3,
        )
    return adopted


class PyroParamsMixin:
    """Gives a ``torch.nn.Module`` Pyro program its parameters' Pyro names and statements.

    ``pyro_name`` (default: the class name) prefixes the parameters' names in the param
    store; set it to tell two modules of one class apart in one store.
    """

    @property
    def pyro_name(self) -> str:
        """Prefix of the parameters' names in Pyro's param store."""
        return self.__dict__.get("_pyro_name") or type(self).__name__

    @pyro_name.setter
    def pyro_name(self, value: str) -> None:
        if not isinstance(value, str) or not value or "$$$" in value:
            raise ValueError(f"pyro_name must be a non-empty string without '$$$', got {value!r}")
        self.__dict__["_pyro_name"] = value

    def pyro_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """``(name, parameter)`` of every parameter the program declares to Pyro (the
        trainable ones)."""
        return ((n, p) for n, p in self.named_parameters() if p.requires_grad)

    def sync_param_store(self) -> list[str]:
        """Put this module's trainable parameters in Pyro's (global) param store as
        ``"<pyro_name>.<name>"``, the same tensor objects (what running its program in
        global mode does), following the rules of this module: values stored there by
        other means (e.g. ``pyro.get_param_store().load(path)``) are adopted first, another
        module's tensor is replaced.  Returns the full names adopted.

        Raises:
            ValueError: the store holds a foreign tensor of another shape under a name.
        """
        return _sync(self.pyro_name, self._full_names())

    def _full_names(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(f"{self.pyro_name}.{name}", p) for name, p in self.pyro_parameters()]

    def _param_statements(self) -> None:
        """One ``pyro.param`` statement per trainable parameter, at the start of a program
        (none inside :func:`local_params`).

        Global mode: the store holds the parameters (:meth:`sync_param_store`) and each
        statement returns the parameter itself.  ``module_local_params=True``: the
        statements are emitted for the handlers only (``SVI`` collects them), the store
        is untouched."""
        if _LOCAL.get():
            return
        full_named = self._full_names()
        if not pyro.settings.get("module_local_params"):
            _sync(self.pyro_name, full_named)
            for full, _ in full_named:
                pyro.param(full)
            return
        for full, p in full_named:
            if "unconstrained" not in p.__dict__:
                p.unconstrained = weakref.ref(p)
            effectful(type="param")(lambda *_, _p=p, **__: _p)(
                full, p, constraint=constraints.real, name=full
            )

    def __getstate__(self):
        # Pyro's store marks parameters with a weak reference, which cannot be pickled
        for p in self.parameters():
            p.__dict__.pop("unconstrained", None)
        return super().__getstate__()
