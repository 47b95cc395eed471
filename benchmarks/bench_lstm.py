"""The LSTM unit, forward and backward, on the shapes of perfkernels._variants (N 256 x D 1024 and
N 64 x D 256), beside NumPy and PyTorch eager pointwise ops (the same formulas as
perfkernels.families.lstm.bench)."""
from .common import isa_or_skip, torch_or_skip  # first: it settles PERFKERNELS_ISA

import numpy as np

from perfkernels._variants import LSTM_SHAPES
from perfkernels.families.lstm.bench import (make_inputs, numpy_backward, numpy_forward, torch_backward,
                                         torch_forward)

SHAPES = [f"{n}x{d}" for n, d in LSTM_SHAPES.values()]


def _shape(s):
    n, d = s.split("x")
    return int(n), int(d)


class LSTMUnit:
    params = (SHAPES,)
    param_names = ["NxD"]

    def setup(self, shape):
        self.pk = isa_or_skip()
        self.x = make_inputs(*_shape(shape))
        self.out = (np.empty_like(self.x["h_prev"]), np.empty_like(self.x["c_prev"]))

    def time_perfkernels(self, shape):
        x = self.x
        self.pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"])

    def time_perfkernels_out(self, shape):
        x = self.x
        self.pk.lstm_unit(x["h_prev"], x["c_prev"], x["gates"], out=self.out)

    def time_numpy(self, shape):
        numpy_forward(self.x["c_prev"], self.x["gates"])


class LSTMUnitBackward:
    params = (SHAPES,)
    param_names = ["NxD"]

    def setup(self, shape):
        self.pk = isa_or_skip()
        self.x = make_inputs(*_shape(shape))

    def time_perfkernels(self, shape):
        x = self.x
        self.pk.lstm_unit_backward(x["c_prev"], x["gates"], x["c"], x["dh"], x["dc"])

    def time_numpy(self, shape):
        x = self.x
        numpy_backward(x["c_prev"], x["gates"], x["c"], x["dh"], x["dc"])


class LSTMUnitTorch:
    params = (SHAPES,)
    param_names = ["NxD"]

    def setup(self, shape):
        torch = torch_or_skip()
        self.torch = torch
        self.t = {k: torch.from_numpy(v) for k, v in make_inputs(*_shape(shape)).items()}

    def time_torch(self, shape):
        torch_forward(self.torch, self.t["c_prev"], self.t["gates"])

    def time_torch_backward(self, shape):
        t = self.t
        torch_backward(self.torch, t["c_prev"], t["gates"], t["c"], t["dh"], t["dc"])
