"""A sweep's config: its names are the registries' names; it validates and round-trips without JAX."""

import numpy as np
import pytest

import polarize as pz
from polarize.core import _choices, _normalizations
from polarize.runs import _build, _config, _numerics


def test_each_family_of_names_is_the_registry_that_builds_it():
    # the CLI validates with the plain names; the objects come from the registries
    assert tuple(_build.OBJECTIVES) == tuple(_config.OBJECTIVES)
    assert tuple(_build.MODELS) == tuple(_config.MODELS)
    assert tuple(_build.PROMPT_OBJECTIVES) == _config.PROMPT_OBJECTIVES
    assert tuple(_numerics.SOLVERS) == _config.SOLVERS
    assert tuple(_normalizations.NORMALIZATIONS) == _choices.NORMALIZATION_NAMES
    for name in _config.OBJECTIVES:
        objective = pz.SweepConfig(objective=name, tokens=3, dim=3).build_objective()
        assert isinstance(objective, pz.AbstractObjective)
    for name in _config.PROMPT_OBJECTIVES:
        config = pz.SweepConfig(model="prompt", objective=name, tokens=3, dim=3)
        model, objective = config.build_model(2, 5), config.build_objective()
        assert isinstance(model, pz.PromptAttention) and model.X.shape == (_config.PROMPT_SAMPLES, 3, 3)
        assert isinstance(objective, (pz.LogisticLabels, pz.SquareLabels)) and objective.y.shape == (4,)
        # initializations 2..4 of the sweep are those of one batch from 0, whatever the piece
        np.testing.assert_array_equal(model.p, config.build_model(0, 5).p[2:])


def test_settings_added_later_default_to_what_earlier_sweeps_had():
    defaults = pz.SweepConfig()
    assert {k: getattr(defaults, k) for k in _config.LATER_SETTINGS} == _config.LATER_SETTINGS


def test_a_config_round_trips_and_refuses_unknown_settings():
    config = pz.SweepConfig(objective="square", kappa=10.0, levels=(0.9, 0.5))
    assert config.levels == (0.5, 0.9)  # sorted once, on construction
    assert pz.SweepConfig.from_dict(config.to_dict()) == config
    with pytest.raises(pz.PolarizeError, match=r"unknown sweep setting\(s\) \['kapa'\]"):
        pz.SweepConfig.from_dict({"kapa": 3.0})
