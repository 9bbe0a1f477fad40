"""The keys of what a function or module reads, one call after another (guards/context.py
`ReadKeys`): a value's key is reused only while it is the same object and cannot have changed;
an object many places hold (a config in every submodule) is keyed once a call and its changes seen."""

from __future__ import annotations

import torch

import minicomp
from minicomp.guards import state_key
from minicomp.guards.read_keys import ReadKeys


class Config:
    def __init__(self, scale: float):
        self.scale = scale


def test_only_what_cannot_change_keeps_its_key():
    def helper():
        return 0

    table, config = {"a": 1}, Config(2.0)
    values = [1, "s", helper, table, config, (1, 2), torch.float32, [3]]
    keys = ReadKeys()
    first = keys(values)
    assert keys._last[2] == [3, 4, 7]  # the dict, the user object and the list: keyed at every reading
    table["a"], config.scale, values[7][0] = 2, 3.0, 4  # changed in place, the same objects
    second = keys(list(values))
    assert second[3] == state_key(table) != first[3]
    assert second[4] == state_key(config) != first[4]
    assert second[7] == state_key([4]) != first[7]
    assert second[:3] == first[:3] and second[5:7] == first[5:7]

    def other():
        return 1

    third = keys([1, "s", other, table, config, (1, 2), torch.float32, [4]])  # a helper rebound
    assert third[2] is other and third[3:] == second[3:]


class Scaled(torch.nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.config = config

    def forward(self, x):
        return x * self.config.scale


class Twice(torch.nn.Module):
    """Three modules holding one config object."""

    def __init__(self):
        super().__init__()
        self.config = Config(2.0)
        self.a, self.b = Scaled(self.config), Scaled(self.config)

    def forward(self, x):
        return self.b(self.a(x)) + 1


def test_a_config_every_submodule_holds_is_seen_to_change():
    model = Twice()
    jitted = minicomp.jit(model)
    x = torch.randn(5)
    for _ in range(2):
        torch.testing.assert_close(jitted(x), x * 4 + 1)
    model.config.scale = 3.0
    torch.testing.assert_close(jitted(x), x * 9 + 1)
    assert jitted.compiled.compiles == 2
