"""The model suite's models, in one place: transformers' GPT-2, BERT and Llama, torchvision's
ResNet-50 and a DLRM in the seed talk's shape (random weights, nothing downloaded), each with its
inputs, sizes real and tiny, and its loss (minicomp/bench/models.py runs them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

LAYERS = 2


class Logits(nn.Module):
    """A transformers model's `.logits`."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs).logits


class Task(nn.Module):
    """A model and its loss: forward(*inputs) gives the logits, forward(*inputs, target=t) the loss."""

    def __init__(self, model: nn.Module, loss: str):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *args, target=None, **kwargs):
        logits = self.model(*args, **kwargs)
        if target is None:
            return logits
        if self.loss == "bce":
            return F.binary_cross_entropy_with_logits(logits.squeeze(-1).float(), target)
        return F.cross_entropy(logits.flatten(0, -2).float(), target.flatten())


class DLRM(nn.Module):
    """DLRM as the seed talk builds it: a bottom MLP of the dense features, a table per sparse
    feature, the pairwise dot products of all these vectors, a top MLP to one logit."""

    def __init__(self, s):
        super().__init__()
        self.bottom = _mlp([s.dense, *s.mlp, s.dim], relu_last=True)
        self.tables = nn.ModuleList(nn.Embedding(s.rows, s.dim) for _ in range(s.tables))
        n = s.tables + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, 1), persistent=False)
        self.top = _mlp([s.dim + n * (n - 1) // 2, *s.mlp, 1], relu_last=False)

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        vectors = torch.stack([x, *(table(sparse[:, i]) for i, table in enumerate(self.tables))], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1))


def _mlp(sizes, relu_last: bool) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _gpt2(tf, s):
    config = tf.GPT2Config(
        n_embd=s.width, n_head=s.heads, n_layer=LAYERS, vocab_size=s.vocab, n_positions=max(1024, s.length),
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    return Logits(tf.GPT2LMHeadModel(config))


def _bert(tf, s):
    config = tf.BertConfig(
        hidden_size=s.width, num_attention_heads=s.heads, intermediate_size=4 * s.width, num_hidden_layers=LAYERS,
        vocab_size=s.vocab, max_position_embeddings=max(512, s.length),
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return Logits(tf.BertForMaskedLM(config))


def _llama(tf, s):
    config = tf.LlamaConfig(
        hidden_size=s.width, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        intermediate_size=s.hidden, num_hidden_layers=LAYERS, vocab_size=s.vocab,
        max_position_embeddings=max(4096, s.length), use_cache=False,
    )  # fmt: skip
    return Logits(tf.LlamaForCausalLM(config))


def _resnet(tv, s):
    if s.blocks is None:
        return tv.models.resnet50()
    return tv.models.ResNet(tv.models.resnet.Bottleneck, s.blocks, num_classes=s.classes)


def _dlrm(_, s):
    return DLRM(s)


def _tokens(s, batch, length, g):
    return (torch.randint(s.vocab, (batch, length), generator=g),), torch.randint(s.vocab, (batch, length), generator=g)


def _images(s, batch, length, g):
    images = torch.randn(batch, 3, s.image, s.image, generator=g).to(memory_format=torch.channels_last)
    return (images,), torch.randint(s.classes, (batch,), generator=g)


def _dlrm_inputs(s, batch, length, g):
    dense = torch.randn(batch, s.dense, generator=g)
    sparse = torch.randint(s.rows, (batch, s.tables), generator=g)
    return (dense, sparse), torch.randint(2, (batch,), generator=g).float()


@dataclass(frozen=True)
class Spec:
    """A model of the suite: the package it needs, its builder and inputs, its sizes real and tiny."""

    library: str | None  # a row is skipped where this does not import
    build: Callable  # (library, sizes) -> nn.Module giving logits
    inputs: Callable  # (sizes, batch, length, generator) -> (args, target), float32 / int64, on the CPU
    real: dict
    tiny: dict
    loss: str = "ce"  # "ce": cross-entropy over the last dim; "bce": binary, of one logit
    decoder: bool = False
    channels_last: bool = False

    def sizes(self, tiny: bool) -> SimpleNamespace:
        return SimpleNamespace(**(self.tiny if tiny else self.real))


_LM_TINY = dict(width=32, heads=4, kv_heads=2, hidden=64, vocab=128, batch=2, length=8)
MODELS = {
    "gpt2": Spec(
        "transformers", _gpt2, _tokens, dict(width=1024, heads=16, vocab=50257, batch=4, length=1024), _LM_TINY,
        decoder=True,
    ),
    "bert": Spec("transformers", _bert, _tokens, dict(width=768, heads=12, vocab=30522, batch=8, length=512), _LM_TINY),
    "llama": Spec(
        "transformers", _llama, _tokens,
        dict(width=2048, heads=16, kv_heads=4, hidden=5632, vocab=32000, batch=4, length=1024), _LM_TINY,
        decoder=True,
    ),
    "resnet50": Spec(
        "torchvision", _resnet, _images, dict(blocks=None, classes=1000, image=224, batch=64, length=None),
        dict(blocks=[1, 1, 1, 1], classes=10, image=32, batch=2, length=None), channels_last=True,
    ),
    "dlrm": Spec(
        None, _dlrm, _dlrm_inputs,
        dict(dense=13, tables=26, rows=100_000, dim=64, mlp=[512, 256], batch=8192, length=None),
        dict(dense=13, tables=4, rows=64, dim=8, mlp=[16, 8], batch=16, length=None), loss="bce",
    ),
}  # fmt: skip


def build_task(spec: Spec, library, s, step: str, device: str, dtype, reference: bool = False) -> Task:
    """The model with its loss, seeded, on the device in `dtype` (reference: float32 holding the
    same dtype-rounded weights), in train mode for `train` only."""
    torch.manual_seed(0)
    task = Task(spec.build(library, s), spec.loss).to(device, dtype)
    if reference:
        task = task.float()
    if spec.channels_last:
        task = task.to(memory_format=torch.channels_last)
    return task.train(step == "train")


def step_inputs(spec: Spec, s, step: str, task: Task, length, device: str, dtype, compute) -> tuple:
    """(args, kwargs, target: train only) of a step, floats rounded to `dtype` and held in `compute`;
    decode steps have batch 1 and one token (decode-static: a StaticCache filled eagerly up to S/2)."""
    g = torch.Generator().manual_seed(1)
    one = step.startswith("decode")
    args, target = spec.inputs(s, 1 if one else s.batch, 1 if one else length, g)
    args = tuple(a.to(dtype).to(device, compute) if a.is_floating_point() else a.to(device) for a in args)
    kwargs = static_cache(task, s, device, g) if step == "decode-static" else {}
    return args, kwargs, target.to(device) if step == "train" else None


def static_cache(task: Task, s, device: str, g) -> dict:
    import transformers

    lm = task.model.inner
    cache = transformers.StaticCache(config=lm.config, max_cache_len=s.length)
    prefix = s.length // 2
    with torch.no_grad():
        lm(
            input_ids=torch.randint(s.vocab, (1, prefix), generator=g).to(device),
            past_key_values=cache,
            cache_position=torch.arange(prefix, device=device),
            use_cache=True,
        )
    position = torch.tensor([prefix], device=device)
    return dict(past_key_values=cache, cache_position=position, position_ids=position[None], use_cache=True)


def rewinding(run: Callable, kwargs: dict) -> Callable:
    """`run` (a decode-static step) made to repeat without end. transformers' StaticCache (5.x) keeps
    its own length per layer (`cumulative_length`, a tensor it advances at each call) and writes the
    new token there, not at `cache_position`: after S/2 calls its places run out (an index error
    inside the GPU's index_copy_). The lengths are set back to S/2 before they reach the end; the
    attention reads the whole static cache at any length, so a step's work does not move with it."""
    cache = kwargs.get("past_key_values")
    layers = [
        layer
        for layer in getattr(cache, "layers", ())
        if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)
        and isinstance(getattr(layer, "keys", None), torch.Tensor)
    ]
    if not layers:
        return run
    prefix = int(kwargs["cache_position"][0])
    every = max(1, min(256, min(layer.keys.shape[-2] for layer in layers) - prefix))
    calls = 0

    def run_rewinding():
        nonlocal calls
        out = run()
        calls += 1
        if calls % every == 0:
            for layer in layers:
                layer.cumulative_length.fill_(prefix)
        return out

    return run_rewinding
