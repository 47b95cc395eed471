"""quantize_dense: a dense submodule (MLPs, a low-rank cross network) in int8 through torchao's
PT2E flow with the x86 Inductor quantizer, against the float32 module it came from.

torchao is optional (never a dependency): these tests skip where it is missing, with the reason;
CI's interop step installs it and sets PERFKERNELS_REQUIRE_TORCHAO=1, under which a failed import
fails.  The reference is the float32 module itself (stock PyTorch): int8 with static per-tensor
activations and per-channel weights stays within a few percent of the outputs' spread.
"""
import builtins
import os

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import perfkernels.torch as pt  # noqa: E402


@pytest.fixture(scope="module")
def pt2e():
    try:
        import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer  # noqa: F401
    except Exception as exc:   # ImportError, or a torchao built for another torch
        if os.environ.get("PERFKERNELS_REQUIRE_TORCHAO") == "1":
            raise
        pytest.skip(f"torchao's PT2E flow is not usable here (optional): {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}")


class Cross(nn.Module):
    """A low-rank cross layer and an MLP: the DCN model's dense shape in small."""

    def __init__(self, width=48, rank=16):
        super().__init__()
        self.V = nn.Linear(width, rank, bias=False)
        self.W = nn.Linear(rank, width)
        self.top = nn.Sequential(nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x0):
        return self.top(x0 * self.W(self.V(x0)) + x0)


def _inputs(n, batch=64, width=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, width, generator=g),) for _ in range(n)]


def _close_to_float(q, model, xs):
    with torch.no_grad():
        for (x,) in xs:
            want, got = model(x), q(x)
            assert got.shape == want.shape
            spread = float(want.std())
            err = float((got - want).abs().max())
            assert err < 0.1 * spread, (err, spread)
            # the int8 model is not the float one: it is quantized (some error)
            assert err > 0


def test_int8_reference_graph_is_close_to_float32(pt2e):
    torch.manual_seed(0)
    model = Cross().eval()
    cal = _inputs(4)
    q = pt.quantize_dense(model, cal[0], calibration=cal, compile=False)
    _close_to_float(q, model, _inputs(2, batch=37, seed=1))      # another batch size too


@pytest.mark.slow            # Inductor compiles the int8 graph: tens of seconds
def test_int8_compiled_is_close_to_float32_at_any_batch(pt2e):
    torch.manual_seed(0)
    model = Cross().eval()
    cal = _inputs(4)
    q = pt.quantize_dense(model, cal[0], calibration=cal)
    _close_to_float(q, model, _inputs(1, batch=64, seed=1) + _inputs(1, batch=301, seed=2))
    f = pt.compile_frozen(model)
    with torch.no_grad():
        for (x,) in _inputs(2, batch=50, seed=3):
            torch.testing.assert_close(f(x), model(x), rtol=1e-4, atol=1e-5)


def test_bad_arguments():
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        pt.quantize_dense(lambda x: x, (torch.ones(2, 3),))
    with pytest.raises(TypeError, match=r"example_inputs\[0\] must be a Tensor"):
        pt.quantize_dense(nn.Linear(3, 1), ([1.0, 2.0],))


def test_missing_torchao_is_a_clear_import_error(monkeypatch):
    real = builtins.__import__

    def blocked(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)
    with pytest.raises(ImportError, match="quantize_dense needs torchao"):
        pt.quantize_dense(nn.Linear(3, 1), (torch.ones(2, 3),))
