"""Regression (issue #43): transformers' Mamba, a tiny config, one training step through
`torch.compile(backend="minicomp")` against eager: the loss and every parameter's gradient. Its
backward's scan kernels read loads masked by row conditions of slice_scatters
(tests/e2e/test_row_conditions.py holds the minimized forms, needing only torch). The suite runs
with MINICOMP_FALLBACK=raise (conftest.py): a graph that falls back to eager fails here."""

import pytest
import torch

transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_tiny_mamba_training_step_matches_eager():
    torch.manual_seed(0)
    config = transformers.MambaConfig(
        vocab_size=99, hidden_size=32, state_size=8, num_hidden_layers=1, intermediate_size=64, use_mambapy=False
    )
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    ids = torch.randint(0, 99, (2, 8))
    expected = model(input_ids=ids, labels=ids).loss
    expected.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    torch._dynamo.reset()
    actual = torch.compile(model, backend="minicomp")(input_ids=ids, labels=ids).loss
    actual.backward()
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    assert grads
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(p.grad, grads[name], atol=1e-4, rtol=1e-3, msg=lambda m, n=name: f"{n}: {m}")
