"""A dynamic graph whose work is nearly all static (capture/static_parts.py, issue #42): text
generation with transformers' default (dynamic) KV cache compiles nothing after Dynamo's
dynamic graph, and matches eager token by token; a graph mostly of dynamic sizes is still
compiled per size.

transformers is optional (`pip install .[zoo]`): without it the model tests skip."""

import pytest
import torch

from minicomp.capture import static_parts


def _llama(tf):
    return tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )  # fmt: skip
    )


def _gpt2(tf):
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64))


@pytest.mark.slow
@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_generation_with_a_dynamic_cache_compiles_nothing_after_the_dynamic_graph(dynamo_compiles, make, caplog):
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = make(tf).eval()
    compiled = torch.compile(model, backend="minicomp")
    caches = [tf.DynamicCache(config=model.config) for _ in range(2)]
    token = torch.randint(0, 128, (1, 6))
    counts = []
    with torch.no_grad(), caplog.at_level("INFO", "minicomp.recompiles"):
        for _ in range(9):  # the prompt, then 8 tokens, each with a longer cache
            got, want = (
                fn(input_ids=token, past_key_values=c, use_cache=True).logits
                for fn, c in zip((compiled, model), caches)
            )
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            counts.append(len(dynamo_compiles))
            token = want[:, -1:].argmax(-1)
    # the prompt, the first token (a static graph each), the second token (the dynamic graph's parts)
    assert counts[3:] == [counts[2]] * 6, counts
    assert "static parts compiled once for every size" in caplog.text
    assert "laid out unlike its trace" not in caplog.text  # the compiled parts ran, not the captured graph


def _mostly_static(x, w, y):
    """x: [n, 4] with n dynamic; w: [4]; y: [8, 4]."""
    a = (y.sin() * 2 + w).relu()  # static, level 0
    grown = torch.cat([x, a[:1]])  # dynamic: [n + 1, 4]
    total = grown.sum(0)  # reads a dynamic value: dynamic, of fixed size [4]
    b = (a * total).tanh() + (y * 3).exp()  # static, level 1
    return b.sum(1) * 5 - 1, grown


def _writes_its_input(x, w, y):
    """Regression: levels order nodes by what they read, so AOTAutograd's `copy_` into `w` (a
    static node of level 0) ran before the dynamic `x * w` read the old `w`. A graph that writes
    is compiled per size."""
    g = (x * w).sum(0)
    w.add_(1)
    return (y.sin() * 2 + g).relu() + (y * 3).exp()


def _reads_a_constant(x, w, y):
    """Regression: a tensor constant (`get_attr`) read by a level-0 static part was copied into
    the cut graph only after that part was built (KeyError)."""
    c = torch.tensor([1.0, 2.0, 3.0, 4.0])
    a = ((y * c).sin().exp().relu() * 2 + w.cos()).tanh()
    return torch.cat([x, a[:1]]), a * 3


def _mostly_dynamic(x, w, y):
    return (x * w).sigmoid().cumsum(0) * 2 + x.exp(), (y + w).sum()


def _run_sizes(fn, sizes, dynamo_compiles):
    w, y = torch.randn(4), torch.randn(8, 4)
    w_eager = w.clone()
    compiled = torch.compile(fn, backend="minicomp")
    counts = []
    with torch.no_grad():
        for n in sizes:
            x = torch.randn(n, 4)
            for got, want in zip(compiled(x, w, y), fn(x, w_eager, y)):
                torch.testing.assert_close(got, want)
            torch.testing.assert_close(w, w_eager)
            counts.append(len(dynamo_compiles))
    return counts


def test_a_mostly_static_graph_compiles_its_parts_once(dynamo_compiles):
    counts = _run_sizes(_mostly_static, [5, 6, 7, 9, 12], dynamo_compiles)
    assert counts[0] == 1 and counts[2:] == [counts[1]] * 3, counts  # parts at the 2nd size, then nothing
    assert counts[1] - counts[0] == 2  # levels 0 and 1


def test_a_graph_that_writes_an_input_is_compiled_per_size(dynamo_compiles):
    counts = _run_sizes(_writes_its_input, [5, 6, 7, 9], dynamo_compiles)
    assert counts == [1, 2, 3, 4], counts


def test_a_constant_read_by_the_first_part(dynamo_compiles):
    counts = _run_sizes(_reads_a_constant, [5, 6, 7, 9], dynamo_compiles)
    assert counts[2:] == [counts[1]] * 2, counts


def test_a_graph_that_cannot_be_cut_is_compiled_per_size(dynamo_compiles, monkeypatch):
    def broken(*args):
        raise RuntimeError("an FX graph it cannot build")

    monkeypatch.setattr(static_parts, "cut", broken)
    counts = _run_sizes(_mostly_static, [5, 6, 7, 9], dynamo_compiles)
    assert counts == [1, 2, 3, 4], counts


def test_a_mostly_dynamic_graph_is_compiled_per_size(dynamo_compiles):
    counts = _run_sizes(_mostly_dynamic, [5, 6, 7, 9], dynamo_compiles)
    assert counts == [1, 2, 3, 4], counts


def test_levels_split_at_each_dynamic_step(dynamo_compiles, monkeypatch):
    """The classification `_mostly_static`'s graph gets: the ops before the cat at level 0, the
    cat and the sum that reads it dynamic, the ops after them at level 1."""
    seen = []
    make = static_parts.StaticParts.__init__

    def spy(self, gm, static, *args):
        seen.append((gm, static, static_parts.levels(gm, static)))
        make(self, gm, static, *args)

    monkeypatch.setattr(static_parts.StaticParts, "__init__", spy)
    _run_sizes(_mostly_static, [5, 6], dynamo_compiles)
    [(gm, static, level)] = seen
    aten = torch.ops.aten
    [relu, cat, total, tanh] = (
        next(n for n in gm.graph.nodes if n.target is op)
        for op in (aten.relu.default, aten.cat.default, aten.sum.dim_IntList, aten.tanh.default)
    )
    assert cat not in static and total not in static
    assert relu in static and level[relu] == 0
    assert tanh in static and level[tanh] == 1


def test_a_part_input_laid_out_unlike_its_trace_runs_as_captured():
    """A static part's input that an ATen op makes at run time is checked against the layout the
    trace predicted: another layout runs the part as captured, never the compiled code."""

    def part(t):
        return (t * 2,)

    gm = torch.fx.symbolic_trace(part)
    made = torch.fx.Graph().call_function(torch.ops.aten.sum.dim_IntList)  # stands for the op making `t`
    made.meta["val"] = torch.empty(4)
    compiled = []
    p = static_parts._Part(gm, [made], "part", lambda *a: compiled.append(a) or (lambda v: (v[0] * 2,)), None)
    strided = torch.randn(8)[::2]
    assert torch.equal(p(strided)[0], strided * 2) and not compiled
    assert torch.equal(p(torch.ones(4))[0], torch.full((4,), 2.0)) and len(compiled) == 1
