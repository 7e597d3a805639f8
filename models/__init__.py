"""Network architectures (installed as ``twodg_pyro.models``)."""
