"""The reference code's protocol as model and training options (the paper profile), beside the
fair profile: NODE/ANODE started at the first query time, their adjoint gradients, the Latent
ODE's sampled prediction and its selection on the validation ELBO, and the two profiles' cells."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from nlmodels import build_model
from nltrain import LoopOptions, train_loop

D64 = torch.float64


class _Constant(nn.Module):
    """The field ``dx/dt = c`` (time first in its input): Euler is exact on it."""

    def __init__(self, c: float, width: int) -> None:
        super().__init__()
        self.c, self.width = c, width

    def forward(self, tx: torch.Tensor) -> torch.Tensor:
        return torch.full((*tx.shape[:-1], self.width), self.c, dtype=tx.dtype)


@pytest.mark.parametrize("method", ["node", "anode"])
@pytest.mark.parametrize("per_sample", [False, True])
def test_first_query_start_predicts_the_last_observation_first(method, per_sample):
    width = 2 if method == "anode" else 1
    obs_t = torch.linspace(0.0, 1.0, 5, dtype=D64)
    query_t = torch.linspace(1.3, 2.5, 4, dtype=D64)
    x = torch.randn(3, 5, 1, dtype=D64, generator=torch.Generator().manual_seed(0))
    if per_sample:  # each trajectory its own grid (shifted), solved through the τ-grid
        shift = torch.tensor([[0.0], [0.1], [0.25]], dtype=D64)
        obs_t, query_t = obs_t + shift, query_t + shift
    out = {}
    for start in ("first_query", "last_observed"):
        model = build_model(method, 1, start=start, vector_field=_Constant(0.5, width)).double()
        out[start] = model(obs_t, x, query_t)
    qt = query_t.expand(3, -1) if query_t.dim() == 1 else query_t
    ot = obs_t.expand(3, -1) if obs_t.dim() == 1 else obs_t
    # x(t) = x_last + c (t - t0): t0 the first query time (reference), or the last observed
    expected_ref = x[:, -1:, :] + 0.5 * (qt - qt[:, :1]).unsqueeze(-1)
    expected_ours = x[:, -1:, :] + 0.5 * (qt - ot[:, -1:]).unsqueeze(-1)
    assert torch.equal(out["first_query"][:, 0], x[:, -1])  # exactly the copy
    torch.testing.assert_close(out["first_query"], expected_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(out["last_observed"], expected_ours, rtol=0, atol=1e-12)


def test_start_is_refused_unless_known():
    with pytest.raises(ValueError, match="start must be one of"):
        build_model("node", 1, start="first_observed")


def test_adjoint_gradients_agree_with_backpropagation_through_the_solver():
    """The reference's gradients (``odeint_adjoint`` with the semi-norm) against exact ones:
    with a tight adaptive solve both are the gradient of the same continuous solution."""
    torch.manual_seed(3)
    obs_t = torch.linspace(0.0, 1.0, 6, dtype=D64)
    query_t = torch.linspace(1.2, 2.0, 5, dtype=D64)
    x = torch.randn(4, 6, 1, dtype=D64)
    target = torch.randn(4, 5, 1, dtype=D64)
    grads = []
    for adjoint in (False, True):
        torch.manual_seed(7)
        model = build_model(
            "node", 1, solver="dopri5", rtol=1e-10, atol=1e-12, adjoint=adjoint, start="first_query"
        ).double()
        model.training_loss(obs_t, x, query_t, target).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
    assert grads[0].abs().max() > 1e-3  # a gradient worth comparing
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-6, atol=1e-9)


SMALL = {"rec_units": 8, "rec_hidden": (8,), "head_hidden": (8,), "ode_hidden": (8, 8)}


def _latent(predict: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model("latent_ode", 1, predict=predict, z0_time="first_query", **SMALL).double()


def test_sampled_prediction_draws_its_own_stream_and_leaves_the_training_draws():
    obs_t = torch.linspace(0.0, 1.0, 6, dtype=D64)
    query_t = torch.linspace(1.2, 2.0, 5, dtype=D64)
    x = torch.randn(4, 6, 1, dtype=D64, generator=torch.Generator().manual_seed(1))
    target = torch.randn(4, 5, 1, dtype=D64, generator=torch.Generator().manual_seed(2))
    mean_model, sample_model = _latent("mean"), _latent("sample")
    with torch.no_grad():
        mean_pred = mean_model(obs_t, x, query_t)
        first, second = sample_model(obs_t, x, query_t), sample_model(obs_t, x, query_t)
        # a sample of the posterior: not its mean, and a fresh one each call
        assert not torch.allclose(first, mean_pred) and not torch.allclose(first, second)
        # the same seed gives the same samples
        again = _latent("sample")
        assert torch.equal(again(obs_t, x, query_t), first)
        # predicting drew nothing from the ELBO's stream: the training loss is the mean model's
        loss_sample = sample_model.training_loss(obs_t, x, query_t, target)
        loss_mean = mean_model.training_loss(obs_t, x, query_t, target)
    assert torch.equal(loss_sample, loss_mean)


def test_sampled_prediction_packed_is_each_members_own():
    """Packed (the members' stacked weights, one dopri5 lane each), each member's sample is the
    one its own forward draws."""
    from torch.func import stack_module_state

    obs_t = torch.linspace(0.0, 1.0, 6, dtype=D64)
    query_t = torch.linspace(1.2, 2.0, 5, dtype=D64)
    x = torch.randn(2, 3, 6, 1, dtype=D64, generator=torch.Generator().manual_seed(4))
    members = [_latent("sample", seed) for seed in (0, 1)]
    twins = [_latent("sample", seed) for seed in (0, 1)]
    params, buffers = stack_module_state(members)
    with torch.no_grad():
        packed = members[0].packed_forward(members, {**params, **buffers}, None, obs_t, x, query_t)
        alone = torch.stack([m(obs_t, x[i], query_t) for i, m in enumerate(twins)])
    torch.testing.assert_close(packed, alone, rtol=1e-12, atol=1e-12)


class _Scripted:
    """A step function with scripted validation RMSE and loss (one member)."""

    graphs_used, n_train, members = False, 4, [0]

    def __init__(self, rmse, loss, metric):
        self.rmse, self.loss, self.epoch, self.selection_metric = rmse, loss, -1, metric

    def begin_epoch(self) -> None:
        self.epoch += 1

    def train_step(self, b_i, start, batch) -> None:
        pass

    def end_epoch(self):
        from nltrain._steps import Readout

        e = self.epoch
        return Readout([True], [1.0], [0], [0.0], [0], [self.loss[e]], [self.rmse[e]], [1])

    def keep_best(self, j):
        return {"epoch": self.epoch}

    def diverged(self, j) -> None:
        pass

    def finish(self, j, best_state, nfe) -> None:
        self.kept = best_state

    def drop(self, keep) -> None:
        pass


@pytest.mark.parametrize(("metric", "best"), [("val_rmse", 1), ("val_loss", 3)])
def test_the_loop_keeps_the_best_epoch_of_the_models_selection_metric(metric, best):
    from nltrain import TrainConfig

    rmse = [0.5, 0.1, 0.3, 0.4, 0.6]
    loss = [9.0, 8.0, 7.0, 2.0, 5.0]  # the ELBO's best epoch is not the RMSE's
    step = _Scripted(rmse, loss, metric)
    (result,) = train_loop(step, TrainConfig(epochs=5, patience=None), LoopOptions())
    assert result.best_epoch == best and step.kept == {"epoch": best}
    assert result.best_val_rmse == rmse[best]


def test_select_is_the_models_selection_metric_and_refused_unless_known():
    assert _latent("mean").selection_metric == "val_rmse"
    torch.manual_seed(0)
    assert build_model("latent_ode", 1, select="val_loss", **SMALL).selection_metric == "val_loss"
    assert build_model("node", 1).selection_metric == "val_rmse"
    with pytest.raises(ValueError, match="select must be one of"):
        build_model("latent_ode", 1, select="val_elbo")


def test_the_fair_profile_is_the_ledgers_former_paper_profile_and_differs_only_where_it_says():
    """The fair profile's baseline cells are the ones the ledger recorded (their config hashes),
    and the paper profile differs from it in exactly the reference's options."""
    from tasks.config import resolve_config
    from tasks.ledger import DEFAULT_LEDGER

    paper, fair = resolve_config("paper"), resolve_config("fair")
    hashes = {
        p: {c.key: c.config_hash() for c in cfg.cells()} for p, cfg in (("p", paper), ("f", fair))
    }
    differ = {k.split("/")[1] for k in hashes["p"] if hashes["p"][k] != hashes["f"][k]}
    assert differ == {"node", "anode", "latent_ode"}
    changed = {m: {k: v for k, v in paper.models[m].items() if fair.models.get(m, {}).get(k) != v}
               for m in differ}  # fmt: skip
    assert changed == {
        "node": {"start": "first_query", "adjoint": True},
        "anode": {"start": "first_query", "adjoint": True},
        "latent_ode": {"predict": "sample", "select": "val_loss"},
    }
    recorded = {
        json.loads(line)["config_hash"] for line in DEFAULT_LEDGER.read_text().split("\n") if line
    }
    baselines = {k: h for k, h in hashes["f"].items() if k.split("/")[1] in differ}
    assert len(baselines) == 90 and set(baselines.values()) <= recorded


def test_ledger_retrains_a_predating_column_after_the_first_seeds_and_before_the_rest():
    """The standing order: every method's first seed, then a column whose records predate
    numerics fingerprints (they count for nothing), then the ablation, then the other seeds."""
    from cells import ledger_record

    from flows.ledger import ledger_groups, to_train
    from tasks.ledger.scope import scope_of
    from tasks.ledger.views import cell_states

    scope = scope_of(methods=["neural_laplace", "node"], numerics=lambda cell: "today")
    systems = ["integro_de", "spiral_dde"]
    cells = scope.select(systems, ablations=None)
    old = [
        ledger_record(c.system, c.method, c.seed, config_hash=c.config_hash, numerics=None)
        for c in cells
        if c.method == "neural_laplace" and not c.ablation
    ]
    states = cell_states(old, cells)
    assert {
        s.state for s in states if s.cell.method == "neural_laplace" and not s.cell.ablation
    } == {"predates"}
    order = [(g.method, g.ablation, g.seeds) for g in ledger_groups(to_train(states), states)]
    nl = [("neural_laplace", "", (s,)) for s in range(1, 5)]
    ablation = [("neural_laplace", "stereographic=False", (s,)) for s in range(5)]
    node = [("node", "", (s,)) for s in range(1, 5)]
    assert order == [("node", "", (0,)), ("neural_laplace", "", (0,)), *nl, *ablation, *node]


def test_ledger_status_counts_a_record_under_the_profile_whose_cell_it_is(tmp_path, capsys):
    from cells import ledger_record

    from flows.cli import main
    from tasks.ledger import append_records
    from tasks.ledger.scope import paper_config

    (fair,) = paper_config(
        profile="fair", systems=["integro_de"], methods=["node"], seeds=[0]
    ).cells()
    path = tmp_path / "ledger.jsonl"
    append_records(path, [ledger_record("integro_de", "node", 0, config_hash=fair.config_hash())])
    args = ["ledger", "status", "--ledger", str(path), "--methods", "node", "--seeds", "0"]
    assert main([*args, "--systems", "integro_de", "--profile", "fair", "--no-ablation"]) == 0
    assert "Table 3: 1 of 1 selected cells recorded" in capsys.readouterr().out
    assert main([*args, "--systems", "integro_de", "--no-ablation"]) == 0  # the paper profile
    out = capsys.readouterr().out
    assert "Table 3: 0 of 1 selected cells recorded" in out
    assert "node: 1 recorded under another config only" in out
    with pytest.raises(SystemExit) as refused:  # not a ledger profile: argparse's usage error
        main([*args, "--profile", "quick"])
    assert refused.value.code == 2
