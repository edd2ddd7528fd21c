"""The encoder's CPU GRU (native kernels, or the pure-torch wavefront) equals nn.GRU, values and
gradients."""

import pytest
import torch

from nlmodels.accel.gru import gru_final_output


@pytest.fixture(params=["auto", "0"], ids=["native-if-built", "torch"])
def cpu_path(request, monkeypatch):
    monkeypatch.setenv("NLLAB_NATIVE", request.param)
    return request.param


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_matches_nn_gru_values_and_gradients(layers, cpu_path):
    torch.manual_seed(layers)
    gru = torch.nn.GRU(3, 5, layers, batch_first=True).double()
    x = torch.randn(4, 9, 3, dtype=torch.float64, requires_grad=True)
    expected = gru(x)[0][:, -1]
    got = gru_final_output(x, gru)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)
    inputs = [x, *gru.parameters()]
    weight = torch.randn_like(expected)
    g_expected = torch.autograd.grad((expected * weight).sum(), inputs)
    g_got = torch.autograd.grad((got * weight).sum(), inputs)
    for a, b in zip(g_got, g_expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_gradcheck_float64(cpu_path):
    torch.manual_seed(0)
    gru = torch.nn.GRU(2, 3, 2, batch_first=True).double()
    x = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *w: gru_final_output(x, gru), (x, *gru.parameters()))


def test_rejects_unsupported_configurations():
    with pytest.raises(ValueError, match="batch-first"):
        gru_final_output(torch.zeros(3, 2, 1), torch.nn.GRU(1, 2, batch_first=False))
    with pytest.raises(ValueError, match="batch-first"):
        gru_final_output(torch.zeros(3, 2, 1), torch.nn.GRU(1, 2, 2, batch_first=True, dropout=0.5))
