"""One-token generation of transformers' Llama and GPT-2 through the backend (tiny configs,
random weights, nothing downloaded): it runs and matches eager. On a GPU the attention
mask minicomp writes must meet SDPA's efficient kernel's alignment (trust issue, class 1).

transformers is optional (`pip install .[zoo]`): without it these tests skip."""

import pytest
import torch

transformers = pytest.importorskip("transformers")


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config)


def _gpt2():
    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_one_token_generation_matches_eager(device, make):
    torch.manual_seed(0)
    model = make().to(device).eval()
    prompt = torch.randint(0, 1000, (1, 7), device=device)
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=4, do_sample=False)
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="minicomp")
        actual = model.generate(prompt, max_new_tokens=4, do_sample=False)
    torch.testing.assert_close(actual, expected)


@pytest.mark.slow  # every product a template, interpreted: about 27 s on a 2-core machine
def test_llama_generation_with_every_matmul_a_template(device, tmp_path, monkeypatch):
    """The same with every matmul a Triton template: a decoding step's projections of one row take
    the one-row form, and a layer's q, k and v share one launch (codegen/row_products.py)."""
    from minicomp import config

    monkeypatch.setenv("MINICOMP_DEBUG_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = _llama().to(device).eval()
    prompt = torch.randint(0, 1000, (1, 7), device=device)
    with torch.no_grad(), config.override(matmul="template"):
        expected = model.generate(prompt, max_new_tokens=3, do_sample=False)
        torch._dynamo.reset()
        model.forward = torch.compile(model.forward, backend="minicomp")
        actual = model.generate(prompt, max_new_tokens=3, do_sample=False)
    torch.testing.assert_close(actual, expected)
    modules = "\n".join(p.read_text() for p in tmp_path.iterdir())
    assert "one row of a times b" in modules and "RowProductsLaunch(" in modules
