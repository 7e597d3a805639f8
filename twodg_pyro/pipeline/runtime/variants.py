"""Several stage-2/3 variants of Algorithm 1 on top of one stage-1 mean-field BNN.

Ablations (Table 5), merging on/off (Table 10), tyings, merge rules and coordinates
change only what happens after stage 1, so :func:`run_variants` trains the
mean-field BNN once and runs each variant on a copy of it.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable

from ..methods.algorithm1 import run_2dg
from ..outputs.artifacts import write_model_files
from ..outputs.costs import add_costs
from ..settings.build import build_net, seed_everything
from ..settings.config import RunConfig, config_from_dict, merge_settings
from .context import RunContext
from .runner import run
from .trained import RunArtifacts

_STAGE1_KEYS = ("data", "network", "prior", "stage1", "seed", "device")


def run_variants(
    base: RunConfig,
    variants: dict[str, dict],
    on_variant: Callable[[str, dict, RunArtifacts], None] | None = None,
) -> tuple[list[dict], RunArtifacts]:
    """Run ``base.methods`` once, then the 2DG stages for each variant.

    Args:
        base: settings of the shared part (stage 1, trained when there are variants,
            and the baselines).
        variants: ``{name: overrides}``; overrides may touch ``sharing`` and ``stage3``
            (and ``num_samples``), never stage-1 settings.
        on_variant: called as ``on_variant(name, record, artifacts)`` after each variant
            (an experiment evaluates and saves it there, so that a long sweep stopped
            half-way keeps what it measured); ``on_variant("-", {}, artifacts)`` first,
            once the shared part has run.

    Returns:
        ``(records, artifacts)``: the baseline records then one 2DG record per variant
        (with a ``variant`` key and, as every record of a run, what a user deploys:
        ``file_bytes`` of its ``.2dgz`` file, ``forwards_per_prediction``, the prediction
        time over the deterministic network's; :mod:`~twodg_pyro.pipeline.outputs.costs`);
        ``artifacts.variants[name]`` holds each variant's trained 2DG BNN
        (:class:`~twodg_pyro.methods.GuidePosterior`).
    """
    for name, over in variants.items():
        bad = [k for k in over if k in _STAGE1_KEYS]
        if bad:
            raise ValueError(f"variant {name!r} changes stage-1 settings {bad}; run it separately")
    # every variant's settings are checked before the shared part trains
    configs = {
        name: config_from_dict(merge_settings(base.to_dict(), o)) for name, o in variants.items()
    }
    methods = [m for m in base.methods if m != "2dg"] or ["mean_field"]
    if variants and "mean_field" not in methods:  # the variants' stage 1
        methods.append("mean_field")
    shared = config_from_dict(merge_settings(base.to_dict(), {"methods": methods}))
    art = run(shared)
    records = [dict(r, variant="-") for r in art.records if r["method"] in base.methods]
    if on_variant is not None:
        on_variant("-", {}, art)
    for name, cfg in configs.items():
        stage1 = copy.deepcopy(art.trained["mean_field"])
        v_art = RunArtifacts(
            split=art.split, eval_data=art.eval_data, trained={"mean_field": stage1}
        )
        seed_everything(cfg.seed)
        rec = run_2dg(RunContext(cfg=cfg, art=v_art), art.split, stage1, art.eval_data)
        rec["variant"] = name
        v_art.records.append(rec)
        _variant_costs(v_art, art, cfg)
        records.append(rec)
        art.variants[name] = v_art.trained["2dg"]
        if on_variant is not None:
            on_variant(name, rec, art)
    return records, art


def _variant_costs(v_art: RunArtifacts, art: RunArtifacts, cfg: RunConfig) -> None:
    """Add the cost fields of :func:`~twodg_pyro.pipeline.outputs.costs.add_costs` to a variant's
    2DG record (``v_art``: the variant's artifacts, its record the only one), measured
    against the shared run's deterministic network (an untrained network of the same
    architecture when the run trained none: the same bytes and forward time)."""
    det = art.trained.get("deterministic")
    reference = det.net if det is not None else build_net(cfg.network, art.split)
    with tempfile.TemporaryDirectory(prefix="twodg-costs-") as tmp:
        files = write_model_files(v_art, cfg, tmp)["files"]  # the 2DG BNN's (stage 1 has no row)
        add_costs(v_art, cfg, reference.to(cfg.device), files)
