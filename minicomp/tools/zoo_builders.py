"""How the zoo's models are built (zoo_models.py): a `Spec` per model, its inputs from a seeded
generator, the builders of transformers, timm and torchvision models (dropout off everywhere)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

VOCAB, BATCH, SEQ = 128, 2, 8
TOKENS = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@dataclass(frozen=True)
class Spec:
    name: str
    group: str  # encoder, decoder, encoder-decoder, vision, audio, state-space, multimodal
    source: str  # transformers, timm, torchvision: the package it needs
    build: Callable  # (torch, package) -> (model, inputs: dict of tensors)


def text_inputs(torch, labels=None, **extra):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    inputs = dict(input_ids=ids, attention_mask=torch.ones(BATCH, SEQ, dtype=torch.long), **extra)
    if labels == "tokens":
        inputs["labels"] = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    elif labels == "class":
        inputs["labels"] = torch.randint(0, 2, (BATCH,), generator=g)
    return inputs


def image_inputs(torch, size=32, batch=BATCH, labels=True):
    g = torch.Generator().manual_seed(2)
    inputs = dict(pixel_values=torch.randn(batch, 3, size, size, generator=g))
    if labels:
        inputs["labels"] = torch.randint(0, 10, (batch,), generator=g)
    return inputs


def hf(config_name, model_name, inputs, **config):
    """A transformers model from `config_name(**config)`, inputs from `inputs(torch)`."""

    def build(torch, transformers):
        cfg = getattr(transformers, config_name)(**config)
        for sub in [cfg, *(getattr(cfg, k) for k in ("text_config", "vision_config") if hasattr(cfg, k))]:
            for key, value in vars(sub).items():
                if "drop" in key and isinstance(value, float):
                    setattr(sub, key, 0.0)
        return getattr(transformers, model_name)(cfg), inputs(torch)

    return build


def lm(config_name, model_name, **config):
    cfg = dict(TOKENS, **config)
    return hf(config_name, model_name, lambda torch: text_inputs(torch, "tokens", use_cache=False), **cfg)


# A classifier's problem type is set, as a fine-tuning config has it: else the first forward sets
# it (a change of the module's config that minicomp.jit refuses to repeat, documented).
SINGLE_LABEL = dict(problem_type="single_label_classification")


def classifier(config_name, model_name, **config):
    cfg = dict(TOKENS, num_labels=2, **SINGLE_LABEL, **config)
    return hf(config_name, model_name, lambda torch: text_inputs(torch, "class"), **cfg)


def masked(config_name, model_name, **config):
    return hf(config_name, model_name, lambda torch: text_inputs(torch, "tokens"), **dict(TOKENS, **config))


def seq2seq(config_name, model_name, **config):
    cfg = dict(TOKENS, decoder_start_token_id=0, **config)

    def inputs(torch):
        x = text_inputs(torch, "tokens", use_cache=False)
        x["decoder_input_ids"] = torch.roll(x["labels"], 1, dims=1)
        return x

    return hf(config_name, model_name, inputs, **cfg)


def vision(config_name, model_name, size=32, batch=BATCH, **config):
    return hf(
        config_name, model_name, lambda torch: image_inputs(torch, size, batch), num_labels=10, **SINGLE_LABEL, **config
    )


def bn_vision(config_name, model_name, **config):
    """Batch norm in training mode: 2 images of 32x32 (see the module docstring)."""
    return vision(config_name, model_name, size=32, batch=2, **config)


def audio(config_name, model_name, **config):
    def inputs(torch):
        g = torch.Generator().manual_seed(3)
        return dict(
            input_values=torch.randn(BATCH, 400, generator=g), labels=torch.randint(0, 2, (BATCH,), generator=g)
        )

    return hf(config_name, model_name, inputs, num_labels=2, **SINGLE_LABEL, **config)


def timm_model(create, **kwargs):
    def build(torch, timm):
        return timm.create_model(create, pretrained=False, num_classes=10, **kwargs), image_inputs(torch, 64, 4)

    return build


def torchvision_model(path, *args, **kwargs):
    """`torchvision.models.<path>(*args, **kwargs)`; a string argument names another attribute there."""

    def build(torch, torchvision):
        def resolve(name):
            obj = torchvision.models
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj

        resolved = [resolve(a[1:]) if isinstance(a, str) and a.startswith("@") else a for a in args]
        return resolve(path)(*resolved, **kwargs), image_inputs(torch, 64, 4)

    return build
