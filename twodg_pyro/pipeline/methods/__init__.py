"""The methods a run trains, one module each: its ``run(ctx)`` trains the method on the
run's :class:`~twodg_pyro.pipeline.runtime.context.RunContext`, keeps its trained method
(:class:`~twodg_pyro.methods.TrainedMethod`) and returns its row of the results table.
Each is registered once, in :data:`~twodg_pyro.pipeline.settings.registry.METHOD_REGISTRY`,
and imported when a run trains it.

``deterministic``, ``mean_field`` and ``two_dg`` (Algorithm 1's stages:
:mod:`.algorithm1`) are the paper's; ``rank1``, ``ssvi``, ``deterministic_matched``,
``ensemble``, ``laplace`` and ``mcmc`` the compared methods.
"""
