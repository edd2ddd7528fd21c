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


@pytest.mark.parametrize(("layers", "batch_first"), [(1, True), (2, True), (3, False)])
def test_the_packers_plain_gru_matches_nn_gru(layers, batch_first):
    """The plain-op GRU that packed training swaps in for ``nn.GRU`` (vmap cannot batch the
    fused RNN kernels): outputs, final states and gradients, and batched over members."""
    from torch.func import functional_call, vmap

    from nltrain._packed_gru import PlainGRU

    torch.manual_seed(1)
    gru = torch.nn.GRU(3, 5, layers, batch_first=batch_first).double()
    plain = PlainGRU(gru)
    assert dict(plain.named_parameters()).keys() == dict(gru.named_parameters()).keys()
    x = torch.randn(4, 9, 3, dtype=torch.float64, requires_grad=True)
    expected, got = gru(x), plain(x)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
    weight = torch.randn_like(expected[0])
    inputs = [x, *gru.parameters()]
    g_expected = torch.autograd.grad((expected[0] * weight).sum(), inputs)
    g_got = torch.autograd.grad((got[0] * weight).sum(), inputs)
    for a, b in zip(g_got, g_expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    # Two members with their own weights, under vmap, each equal to its own nn.GRU.
    other = torch.nn.GRU(3, 5, layers, batch_first=batch_first).double()
    states = {
        n: torch.stack([dict(m.named_parameters())[n].detach() for m in (gru, other)])
        for n, _ in gru.named_parameters()
    }
    xs = torch.randn(2, 4, 9, 3, dtype=torch.float64)
    out = vmap(lambda s, xi: functional_call(plain, s, (xi,))[0])(states, xs)
    for i, m in enumerate((gru, other)):
        torch.testing.assert_close(out[i], m(xs[i])[0], rtol=0, atol=1e-14)


def test_plain_formulas_under_vmap_and_on_request():
    from torch.func import vmap

    from nlmodels.accel import plain_formulas, select

    x = torch.zeros(2, 3, dtype=torch.float64)
    assert select(x) != "plain"
    with plain_formulas():
        assert select(x) == "plain"
    assert select(x) != "plain"
    seen = []
    vmap(lambda row: seen.append(select(row)) or row)(x)
    assert seen == ["plain"]
