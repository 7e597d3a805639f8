"""Named settings for the main job.

``digits`` is what ``twodg-pyro run`` (and ``make demo``) uses without a config:
a 64-128-10 MLP on scikit-learn's digits.  The paper's absolute outlier rule
(``|mu| > 0.2``) would make about half of this small network's weights outliers
(spec, Stage 1 step 3), so the preset uses the scale-aware quantile rule (the top
0.5% of ``|mu|``) with ``P_g = 0.5%``, and ``K = 32`` initial components (the paper's
2000-6000 are for ~10^5-10^7 weights; this network has 9,610).
"""

from __future__ import annotations

__all__ = ["PRESETS", "preset"]

PRESETS: dict[str, dict] = {
    "digits": {
        "methods": ["deterministic", "mean_field", "2dg"],
        "data": {"name": "digits", "batch_size": 128},
        "network": {"arch": "mlp", "hidden": [128]},
        "prior": {"kind": "normal", "scale": 1.0},
        "stage1": {"epochs": 150, "lr_loc": 1e-2, "lr_scale": 1e-2, "deterministic_epochs": 150},
        "sharing": {
            "outlier_rule": "quantile",
            "mu_quantile": 0.995,
            "grad_percentile": 0.005,
            "n_components": 32,
            "n_min": 20,
            "tau_d": 0.01,
        },
        "stage3": {"epochs": 60, "lr_centre": 1e-2, "lr_outlier": 1e-2, "lr_cov": 1e-2},
    },
}


def preset(name: str) -> dict:
    """A copy of the named preset's settings (a nested dict for ``config_from_dict``)."""
    import copy

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
