"""The zoo's timm and torchvision models (zoo_models.py)."""

from __future__ import annotations

from minicomp.tools.zoo_builders import Spec, timm_model, torchvision_model

VISION_LIBRARIES = [
    Spec("timm-resnet", "vision", "timm", timm_model("resnet18", layers=[1, 1, 1, 1])),
    Spec(
        "timm-vit",
        "vision",
        "timm",
        timm_model("vit_tiny_patch16_224", img_size=64, patch_size=16, embed_dim=32, depth=2, num_heads=2),
    ),
    Spec("timm-convnext", "vision", "timm", timm_model("convnext_atto", depths=(1, 1, 1, 1), dims=(8, 16, 24, 32))),
    Spec("timm-mobilenetv3", "vision", "timm", timm_model("mobilenetv3_small_050")),
    Spec("timm-efficientnet", "vision", "timm", timm_model("efficientnet_b0")),  # its width and depth are fixed
    Spec(
        "tv-resnet",
        "vision",
        "torchvision",
        torchvision_model("resnet.ResNet", "@resnet.BasicBlock", [1, 1, 1, 1], num_classes=10),
    ),
    Spec(
        "tv-mobilenet-v2", "vision", "torchvision", torchvision_model("mobilenet_v2", width_mult=0.25, num_classes=10)
    ),
    Spec(
        "tv-vit",
        "vision",
        "torchvision",
        torchvision_model(
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
    Spec("tv-squeezenet", "vision", "torchvision", torchvision_model("squeezenet1_1", num_classes=10)),
    Spec(
        "tv-densenet",
        "vision",
        "torchvision",
        torchvision_model("DenseNet", growth_rate=8, block_config=(2, 2), num_init_features=16, num_classes=10),
    ),
]
