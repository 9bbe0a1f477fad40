"""The zoo's transformers models (zoo_models.py): tiny configs of real architectures."""

from __future__ import annotations

from minicomp.tools.zoo_builders import (
    BATCH,
    SEQ,
    TOKENS,
    VOCAB,
    Spec,
    audio,
    bn_vision,
    classifier,
    hf,
    image_inputs,
    lm,
    masked,
    seq2seq,
    text_inputs,
    vision,
)

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
    Spec("bert", "encoder", "transformers", classifier("BertConfig", "BertForSequenceClassification", **_BERTISH)),
    Spec("roberta", "encoder", "transformers", masked("RobertaConfig", "RobertaForMaskedLM", **_BERTISH)),
    Spec(
        "distilbert",
        "encoder",
        "transformers",
        classifier(
            "DistilBertConfig", "DistilBertForSequenceClassification", dim=32, n_layers=2, n_heads=2, hidden_dim=64
        ),
    ),
    Spec(
        "albert", "encoder", "transformers", masked("AlbertConfig", "AlbertForMaskedLM", embedding_size=16, **_BERTISH)
    ),
    Spec(
        "electra",
        "encoder",
        "transformers",
        classifier("ElectraConfig", "ElectraForSequenceClassification", embedding_size=32, **_BERTISH),
    ),
    Spec(
        "deberta-v2",
        "encoder",
        "transformers",
        classifier("DebertaV2Config", "DebertaV2ForSequenceClassification", **_BERTISH),
    ),
    # decoders
    Spec(
        "gpt2",
        "decoder",
        "transformers",
        lm("GPT2Config", "GPT2LMHeadModel", n_embd=32, n_layer=2, n_head=2, n_positions=64),
    ),
    Spec(
        "gpt-neo",
        "decoder",
        "transformers",
        lm(
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
        lm("GPTJConfig", "GPTJForCausalLM", n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_positions=64),
    ),
    Spec(
        "opt",
        "decoder",
        "transformers",
        lm(
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
    Spec("llama", "decoder", "transformers", lm("LlamaConfig", "LlamaForCausalLM", **_LLAMAISH)),
    Spec(
        "mistral", "decoder", "transformers", lm("MistralConfig", "MistralForCausalLM", sliding_window=4, **_LLAMAISH)
    ),
    Spec("qwen2", "decoder", "transformers", lm("Qwen2Config", "Qwen2ForCausalLM", **_LLAMAISH)),
    Spec("gemma", "decoder", "transformers", lm("GemmaConfig", "GemmaForCausalLM", head_dim=8, **_LLAMAISH)),
    Spec("phi", "decoder", "transformers", lm("PhiConfig", "PhiForCausalLM", **_LLAMAISH)),
    Spec(
        "falcon",
        "decoder",
        "transformers",
        lm("FalconConfig", "FalconForCausalLM", hidden_size=32, num_hidden_layers=2, num_attention_heads=2),
    ),
    Spec(
        "bloom", "decoder", "transformers", lm("BloomConfig", "BloomForCausalLM", hidden_size=32, n_layer=2, n_head=2)
    ),
    Spec(
        "mpt",
        "decoder",
        "transformers",
        lm("MptConfig", "MptForCausalLM", d_model=32, n_layers=2, n_heads=2, max_seq_len=64),
    ),
    # encoder-decoders
    Spec(
        "t5",
        "encoder-decoder",
        "transformers",
        seq2seq(
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
    Spec("bart", "encoder-decoder", "transformers", seq2seq("BartConfig", "BartForConditionalGeneration", **_ENC_DEC)),
    Spec(
        "marian",
        "encoder-decoder",
        "transformers",
        seq2seq("MarianConfig", "MarianMTModel", decoder_vocab_size=VOCAB, **_ENC_DEC),
    ),
    Spec(
        "pegasus",
        "encoder-decoder",
        "transformers",
        seq2seq("PegasusConfig", "PegasusForConditionalGeneration", **_ENC_DEC),
    ),
    # vision
    Spec(
        "vit",
        "vision",
        "transformers",
        vision("ViTConfig", "ViTForImageClassification", image_size=32, patch_size=8, **_BERTISH),
    ),
    Spec(
        "deit",
        "vision",
        "transformers",
        vision("DeiTConfig", "DeiTForImageClassification", image_size=32, patch_size=8, **_BERTISH),
    ),
    Spec(
        "swin",
        "vision",
        "transformers",
        vision(
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
        vision("ConvNextConfig", "ConvNextForImageClassification", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
    ),
    Spec(
        "resnet",
        "vision",
        "transformers",
        bn_vision(
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
        bn_vision(
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
        bn_vision(
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
        bn_vision(
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
        hf(
            "SegformerConfig",
            "SegformerForSemanticSegmentation",
            lambda torch: dict(
                image_inputs(torch, 32, labels=False),
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
        hf(
            "CLIPConfig",
            "CLIPModel",
            lambda torch: dict(text_inputs(torch), **image_inputs(torch, 32, labels=False), return_loss=True),
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
    Spec("wav2vec2", "audio", "transformers", audio("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification", **_WAV)),
    Spec("hubert", "audio", "transformers", audio("HubertConfig", "HubertForSequenceClassification", **_WAV)),
    Spec(
        "whisper",
        "audio",
        "transformers",
        hf(
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
        lm(
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
        lm(
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
