"""int8 quantization shared by the torch backends: which scheme fits a model, and applying it."""


def is_conv_net(module) -> bool:
    """True when convolutions hold most of the weights (static int8 with calibration suits these);
    Linear-heavy models (transformers, ViT) take dynamic int8 instead."""
    from torch import nn

    conv = sum(p.numel() for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)
               for p in m.parameters(recurse=False))
    linear = sum(p.numel() for m in module.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False))
    return conv > linear
