"""Regional compilation (issue #42): `torch.compile` on each decoder block of transformers' Llama
instead of the whole model, the way PyTorch users cut a deep model's compile time. The blocks
share one Dynamo graph (same code, the parameters are inputs), so minicomp compiles one forward
and one backward for all of them, and a training step matches eager.

transformers is optional (`pip install .[zoo]`): without it these tests skip."""

import pytest
import torch

transformers = pytest.importorskip("transformers")


def _llama(layers: int):
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,  # a cache object passed to each block is guarded on by Dynamo: a graph per block
    )
    return transformers.LlamaForCausalLM(config)


@pytest.mark.slow
def test_compiled_blocks_share_one_compile_and_train_as_eager(dynamo_compiles):
    torch.manual_seed(0)
    model, reference = _llama(3), _llama(3)
    reference.load_state_dict(model.state_dict())
    for block in model.model.layers:
        block.compile(backend="minicomp")
    ids = torch.randint(0, 128, (2, 9))
    for _ in range(2):  # the second step compiles nothing
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    expected = reference(input_ids=ids, labels=ids).loss
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, atol=1e-5, rtol=1e-4)
    assert [n.rsplit("_", 1)[-1] for n in dynamo_compiles] == ["forward", "backward"]
