"""The model zoo's registry: tiny random configs of real architectures (`minicomp zoo`, zoo.py).

Each entry builds a model and its inputs from a seeded generator, in float32 on the CPU: 1-2
layers, hidden sizes of 16-64, a vocabulary of 128, no dropout (every config field named
`*drop*` is 0, every `nn.Dropout` has p=0), so eager and compiled runs see the same function.
Sources: transformers (the `zoo` extra), timm and torchvision (where they import: a source that
does not import is skipped, not failed).

Inputs are well conditioned: float64 eager must agree with float32 eager (zoo_run.py measures it
per run and reports it as `fp32_vs_fp64`). The one choice that needs care is batch norm in
training mode: it normalizes by the batch's statistics, and over few values float32 rounding
decides the result. Measured (float32 eager against float64 eager, largest error relative to the
tensor's magnitude): RegNet on 2 images of 8x8 (1x1 maps at the last stage) is off by 0.8, on 2
of 16x16 by 2e-6. The transformers CNNs take 2 images of 32x32 (at least 2x2x2 values per channel
at the last stage; 1e-6, up to 5e-4 for MobileNetV2's second training step), the timm and
torchvision ones, which downsample by 32, 4 images of 64x64.
"""

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


def _text(torch, labels=None, **extra):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    inputs = dict(input_ids=ids, attention_mask=torch.ones(BATCH, SEQ, dtype=torch.long), **extra)
    if labels == "tokens":
        inputs["labels"] = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    elif labels == "class":
        inputs["labels"] = torch.randint(0, 2, (BATCH,), generator=g)
    return inputs


def _image(torch, size=32, batch=BATCH, labels=True):
    g = torch.Generator().manual_seed(2)
    inputs = dict(pixel_values=torch.randn(batch, 3, size, size, generator=g))
    if labels:
        inputs["labels"] = torch.randint(0, 10, (batch,), generator=g)
    return inputs


def _hf(config_name, model_name, inputs, **config):
    """A transformers model from `config_name(**config)`, inputs from `inputs(torch)`."""

    def build(torch, transformers):
        cfg = getattr(transformers, config_name)(**config)
        for sub in [cfg, *(getattr(cfg, k) for k in ("text_config", "vision_config") if hasattr(cfg, k))]:
            for key, value in vars(sub).items():
                if "drop" in key and isinstance(value, float):
                    setattr(sub, key, 0.0)
        return getattr(transformers, model_name)(cfg), inputs(torch)

    return build


def _lm(config_name, model_name, **config):
    cfg = dict(TOKENS, **config)
    return _hf(config_name, model_name, lambda torch: _text(torch, "tokens", use_cache=False), **cfg)


# A classifier's problem type is set, as a fine-tuning config has it: else the first forward sets
# it (a change of the module's config that minicomp.jit refuses to repeat, documented).
SINGLE_LABEL = dict(problem_type="single_label_classification")


def _classifier(config_name, model_name, **config):
    cfg = dict(TOKENS, num_labels=2, **SINGLE_LABEL, **config)
    return _hf(config_name, model_name, lambda torch: _text(torch, "class"), **cfg)


def _masked(config_name, model_name, **config):
    return _hf(config_name, model_name, lambda torch: _text(torch, "tokens"), **dict(TOKENS, **config))


def _seq2seq(config_name, model_name, **config):
    cfg = dict(TOKENS, decoder_start_token_id=0, **config)

    def inputs(torch):
        x = _text(torch, "tokens", use_cache=False)
        x["decoder_input_ids"] = torch.roll(x["labels"], 1, dims=1)
        return x

    return _hf(config_name, model_name, inputs, **cfg)


def _vision(config_name, model_name, size=32, batch=BATCH, **config):
    return _hf(
        config_name, model_name, lambda torch: _image(torch, size, batch), num_labels=10, **SINGLE_LABEL, **config
    )


def _bn_vision(config_name, model_name, **config):
    """Batch norm in training mode: 2 images of 32x32 (see the module docstring)."""
    return _vision(config_name, model_name, size=32, batch=2, **config)


def _audio(config_name, model_name, **config):
    def inputs(torch):
        g = torch.Generator().manual_seed(3)
        return dict(
            input_values=torch.randn(BATCH, 400, generator=g), labels=torch.randint(0, 2, (BATCH,), generator=g)
        )

    return _hf(config_name, model_name, inputs, num_labels=2, **SINGLE_LABEL, **config)


_BERTISH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
_LLAMAISH = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64
)
_WAV = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(32, 32),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
    mask_time_prob=0.0,
)
_ENC_DEC = dict(
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)

TRANSFORMERS = [
    # encoders
    Spec("bert", "encoder", "transformers", _classifier("BertConfig", "BertForSequenceClassification", **_BERTISH)),
    Spec("roberta", "encoder", "transformers", _masked("RobertaConfig", "RobertaForMaskedLM", **_BERTISH)),
    Spec(
        "distilbert",
        "encoder",
        "transformers",
        _classifier(
            "DistilBertConfig", "DistilBertForSequenceClassification", dim=32, n_layers=2, n_heads=2, hidden_dim=64
        ),
    ),
    Spec(
        "albert", "encoder", "transformers", _masked("AlbertConfig", "AlbertForMaskedLM", embedding_size=16, **_BERTISH)
    ),
    Spec(
        "electra",
        "encoder",
        "transformers",
        _classifier("ElectraConfig", "ElectraForSequenceClassification", embedding_size=32, **_BERTISH),
    ),
    Spec(
        "deberta-v2",
        "encoder",
        "transformers",
        _classifier("DebertaV2Config", "DebertaV2ForSequenceClassification", **_BERTISH),
    ),
    # decoders
    Spec(
        "gpt2",
        "decoder",
        "transformers",
        _lm("GPT2Config", "GPT2LMHeadModel", n_embd=32, n_layer=2, n_head=2, n_positions=64),
    ),
    Spec(
        "gpt-neo",
        "decoder",
        "transformers",
        _lm(
            "GPTNeoConfig",
            "GPTNeoForCausalLM",
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            max_position_embeddings=64,
        ),
    ),
    Spec(
        "gpt-j",
        "decoder",
        "transformers",
        _lm("GPTJConfig", "GPTJForCausalLM", n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=64),
    ),
    Spec(
        "opt",
        "decoder",
        "transformers",
        _lm(
            "OPTConfig",
            "OPTForCausalLM",
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
        ),
    ),
    Spec("llama", "decoder", "transformers", _lm("LlamaConfig", "LlamaForCausalLM", **_LLAMAISH)),
    Spec(
        "mistral", "decoder", "transformers", _lm("MistralConfig", "MistralForCausalLM", sliding_window=4, **_LLAMAISH)
    ),
    Spec("qwen2", "decoder", "transformers", _lm("Qwen2Config", "Qwen2ForCausalLM", **_LLAMAISH)),
    Spec("gemma", "decoder", "transformers", _lm("GemmaConfig", "GemmaForCausalLM", head_dim=8, **_LLAMAISH)),
    Spec("phi", "decoder", "transformers", _lm("PhiConfig", "PhiForCausalLM", **_LLAMAISH)),
    Spec(
        "falcon",
        "decoder",
        "transformers",
        _lm("FalconConfig", "FalconForCausalLM", hidden_size=32, num_hidden_layers=2, num_attention_heads=2),
    ),
    Spec(
        "bloom", "decoder", "transformers", _lm("BloomConfig", "BloomForCausalLM", hidden_size=32, n_layer=2, n_head=2)
    ),
    Spec(
        "mpt",
        "decoder",
        "transformers",
        _lm("MptConfig", "MptForCausalLM", d_model=32, n_layers=2, n_heads=2, max_seq_len=64),
    ),
    # encoder-decoders
    Spec(
        "t5",
        "encoder-decoder",
        "transformers",
        _seq2seq(
            "T5Config",
            "T5ForConditionalGeneration",
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=2,
        ),
    ),
    Spec("bart", "encoder-decoder", "transformers", _seq2seq("BartConfig", "BartForConditionalGeneration", **_ENC_DEC)),
    Spec(
        "marian",
        "encoder-decoder",
        "transformers",
        _seq2seq("MarianConfig", "MarianMTModel", decoder_vocab_size=VOCAB, **_ENC_DEC),
    ),
    Spec(
        "pegasus",
        "encoder-decoder",
        "transformers",
        _seq2seq("PegasusConfig", "PegasusForConditionalGeneration", **_ENC_DEC),
    ),
    # vision
    Spec(
        "vit",
        "vision",
        "transformers",
        _vision("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, **_BERTISH),
    ),
    Spec(
        "deit",
        "vision",
        "transformers",
        _vision("DeiTConfig", "DeiTForImageClassification", image_size=32, patch_size=8, **_BERTISH),
    ),
    Spec(
        "swin",
        "vision",
        "transformers",
        _vision(
            "SwinConfig",
            "SwinForImageClassification",
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
        ),
    ),
    Spec(
        "convnext",
        "vision",
        "transformers",
        _vision("ConvNextConfig", "ConvNextForImageClassification", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
    ),
    Spec(
        "resnet",
        "vision",
        "transformers",
        _bn_vision(
            "ResNetConfig",
            "ResNetForImageClassification",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            layer_type="basic",
        ),
    ),
    Spec(
        "regnet",
        "vision",
        "transformers",
        _bn_vision(
            "RegNetConfig",
            "RegNetForImageClassification",
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            groups_width=8,
        ),
    ),
    Spec(
        "mobilenet-v2",
        "vision",
        "transformers",
        _bn_vision(
            "MobileNetV2Config",
            "MobileNetV2ForImageClassification",
            image_size=32,
            depth_multiplier=0.25,
            finegrained_output=False,
        ),
    ),
    Spec(
        "efficientnet",
        "vision",
        "transformers",
        _bn_vision(
            "EfficientNetConfig",
            "EfficientNetForImageClassification",
            image_size=32,
            width_coefficient=0.25,
            depth_coefficient=0.2,
            hidden_dim=320,  # the top batch norm's width: round_filters(1280) at width 0.25
            kernel_sizes=[3, 3],
            in_channels=[32, 16],
            out_channels=[16, 24],
            num_block_repeats=[1, 1],
            expand_ratios=[1, 6],
            strides=[1, 2],
        ),
    ),
    Spec(
        "segformer",
        "vision",
        "transformers",
        _hf(
            "SegformerConfig",
            "SegformerForSemanticSegmentation",
            lambda torch: dict(
                _image(torch, 32, labels=False),
                labels=torch.randint(0, 4, (BATCH, 32, 32), generator=torch.Generator().manual_seed(4)),
            ),
            num_labels=4,
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            num_attention_heads=[1, 2],
            patch_sizes=[7, 3],
            strides=[4, 2],
            mlp_ratios=[2, 2],
            decoder_hidden_size=32,
        ),
    ),
    Spec(
        "clip",
        "multimodal",
        "transformers",
        _hf(
            "CLIPConfig",
            "CLIPModel",
            lambda torch: dict(_text(torch), **_image(torch, 32, labels=False), return_loss=True),
            text_config=dict(
                TOKENS,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=64,
            ),
            vision_config=dict(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
            ),
            projection_dim=16,
        ),
    ),
    # audio
    Spec("wav2vec2", "audio", "transformers", _audio("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", **_WAV)),
    Spec("hubert", "audio", "transformers", _audio("HubertConfig", "HubertForSequenceClassification", **_WAV)),
    Spec(
        "whisper",
        "audio",
        "transformers",
        _hf(
            "WhisperConfig",
            "WhisperForConditionalGeneration",
            lambda torch: dict(
                input_features=torch.randn(BATCH, 16, 32, generator=torch.Generator().manual_seed(5)),
                decoder_input_ids=torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(6)),
                labels=torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(7)),
                use_cache=False,
            ),
            **dict(TOKENS, decoder_start_token_id=0, num_mel_bins=16, max_source_positions=16, max_target_positions=32),
            **{k: v for k, v in _ENC_DEC.items() if k != "max_position_embeddings"},
        ),
    ),
    # state-space
    Spec(
        "mamba",
        "state-space",
        "transformers",
        _lm(
            "MambaConfig",
            "MambaForCausalLM",
            hidden_size=32,
            state_size=8,
            num_hidden_layers=2,
            expand=2,
            conv_kernel=4,
        ),
    ),
    Spec(
        "mamba2",
        "state-space",
        "transformers",
        _lm(
            "Mamba2Config",
            "Mamba2ForCausalLM",
            hidden_size=32,
            state_size=8,
            num_hidden_layers=2,
            expand=2,
            num_heads=8,
            head_dim=8,
            n_groups=1,
            chunk_size=4,
            conv_kernel=4,
        ),
    ),
]


def _timm(create, **kwargs):
    def build(torch, timm):
        return timm.create_model(create, pretrained=False, num_classes=10, **kwargs), _image(torch, 64, 4)

    return build


def _torchvision(path, *args, **kwargs):
    """`torchvision.models.<path>(*args, **kwargs)`; a string argument names another attribute there."""

    def build(torch, torchvision):
        def resolve(name):
            obj = torchvision.models
            for part in name.split("."):
                obj = getattr(obj, part)
            return obj

        resolved = [resolve(a[1:]) if isinstance(a, str) and a.startswith("@") else a for a in args]
        return resolve(path)(*resolved, **kwargs), _image(torch, 64, 4)

    return build


VISION_LIBRARIES = [
    Spec("timm-resnet", "vision", "timm", _timm("resnet18", layers=[1, 1, 1, 1])),
    Spec(
        "timm-vit",
        "vision",
        "timm",
        _timm("vit_tiny_patch16_224", img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2),
    ),
    Spec("timm-convnext", "vision", "timm", _timm("convnext_atto", depths=(1, 1, 1, 1), dims=(8, 16, 24, 32))),
    Spec("timm-mobilenetv3", "vision", "timm", _timm("mobilenetv3_small_050")),
    Spec("timm-efficientnet", "vision", "timm", _timm("efficientnet_b0")),  # its width and depth are fixed
    Spec(
        "tv-resnet",
        "vision",
        "torchvision",
        _torchvision("resnet.ResNet", "@resnet.BasicBlock", [1, 1, 1, 1], num_classes=10),
    ),
    Spec("tv-mobilenet-v2", "vision", "torchvision", _torchvision("mobilenet_v2", width_mult=0.25, num_classes=10)),
    Spec(
        "tv-vit",
        "vision",
        "torchvision",
        _torchvision(
            "VisionTransformer",
            image_size=64,
            patch_size=16,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
            num_classes=10,
        ),
    ),
    Spec("tv-squeezenet", "vision", "torchvision", _torchvision("squeezenet1_1", num_classes=10)),
    Spec(
        "tv-densenet",
        "vision",
        "torchvision",
        _torchvision("DenseNet", growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=10),
    ),
]

MODELS = {spec.name: spec for spec in TRANSFORMERS + VISION_LIBRARIES}
# A handful of small, quick ones for CI: an encoder, a decoder, a CNN with batch norm, a state-space model.
FAST = ["bert", "llama", "resnet", "mamba"]
