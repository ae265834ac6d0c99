"""Image generation: a latent diffusion UNet from diffusers' architecture code, benchmarked one denoising step.

One pass = one call of the UNet that a diffusion pipeline makes at every step: the noisy latents (batch, 4,
side, side), the timestep and the text encoder's hidden states (batch, 77, 768: CLIP ViT-L/14's) in, the
predicted noise (batch, 4, side, side) out. The scheduler, the text encoder and the VAE are outside it: a
50-step image is 50 of these passes (100 with classifier-free guidance, at twice the batch). The output check
compares the predicted noise with eager fp32's (cosine similarity).
"""

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ..core.errors import UsageError
from .base import ModelSpec

# Stable Diffusion 1.5's UNet (its unet/config.json): 859.5 M parameters, 3.4 GB in fp32. The attention_head_dim
# of 8 is the number of heads (diffusers' historical name): 8 heads of 40, 80, 160 channels.
SD15_UNET = (("sample_size", 64), ("in_channels", 4), ("out_channels", 4),
             ("block_out_channels", (320, 640, 1280, 1280)), ("layers_per_block", 2), ("cross_attention_dim", 768),
             ("attention_head_dim", 8),
             ("down_block_types", ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                                   "DownBlock2D")),
             ("up_block_types", ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D")))
TEXT_TOKENS = 77                # CLIP's context: the prompt's hidden states the cross-attention reads
TIMESTEP = 500                  # a step halfway through a 1000-step schedule
ACTIVATIONS = 16                # widest feature maps held at once / (batch x first block width x side^2): the skips


def load_diffusers():
    # diffusers imports transformers, and that torchvision when it is installed: make sure that import works first
    from ..compat.torchvision_shim import ensure_torchvision

    ensure_torchvision()
    import diffusers

    return diffusers


class DenoisingStep(nn.Module):
    """(latents, timestep, text hidden states) in, the predicted noise as a plain tensor out: a form every backend
    can trace or export."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor):
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]


@dataclass(frozen=True)
class UNet(ModelSpec):
    """A diffusers UNet2DConditionModel built from `config` (key, value pairs over diffusers' defaults) with
    random weights. Its shape is `input_size`, the latent's side (64: a 512 x 512 image through SD's VAE),
    a multiple of 2 ^ (blocks - 1) so every down block halves it evenly; `--config-override` changes the config."""

    config: tuple = ()

    config_name = "UNet2DConditionModel"

    def _kwargs(self) -> dict:
        """diffusers' defaults, the entry's config and the overrides."""
        signature = inspect.signature(load_diffusers().UNet2DConditionModel.__init__)
        defaults = {k: p.default for k, p in signature.parameters.items()
                    if k != "self" and p.default is not inspect.Parameter.empty}
        return {**defaults, **dict(self.config), **dict(self.config_overrides)}

    def _meta_unet(self):
        with torch.device("meta"):          # nothing allocated
            return load_diffusers().UNet2DConditionModel(**self._kwargs())

    def config_dict(self):
        """The config, built on the meta device to check it."""
        self._meta_unet()
        return self._kwargs()

    def _build_module(self, shape):
        return DenoisingStep(load_diffusers().UNet2DConditionModel(**self._kwargs()))

    def weight_bytes(self):
        return sum(p.numel() for p in self._meta_unet().parameters()) * 4

    def smoke_shape(self):
        return {"input_size": self._factor()}

    def _factor(self) -> int:
        return 2 ** (len(self._kwargs()["block_out_channels"]) - 1)

    def check_shape(self, shape):
        factor = self._factor()
        if shape["input_size"] % factor:
            raise UsageError(f"--input-size {shape['input_size']} is invalid for {self.name}; accepted: a multiple "
                             f"of {factor} (the latent's side, halved by each of its down blocks)")

    def example_inputs(self, batch_size, shape, module):
        """Fixed seeded latents and text hidden states (standard normal: a scheduler's noise, CLIP's normalised
        output), and the timestep of every latent."""
        gen = torch.Generator().manual_seed(1234)
        config = module.unet.config
        side = shape["input_size"]
        latents = torch.randn((batch_size, config.in_channels, side, side), generator=gen)
        text = torch.randn((batch_size, TEXT_TOKENS, config.cross_attention_dim), generator=gen)
        return latents, torch.full((batch_size,), TIMESTEP, dtype=torch.int64), text

    def calibration_inputs(self, batch_size, shape, module, n):
        """Latents and text of other seeds, at timesteps across the schedule (static int8 calibration)."""
        latents, timestep, text = self.example_inputs(batch_size, shape, module)
        gens = [torch.Generator().manual_seed(99 + i) for i in range(n)]
        return [(torch.randn(latents.shape, generator=g), torch.full_like(timestep, i * 999 // max(n - 1, 1)),
                 torch.randn(text.shape, generator=g)) for i, g in enumerate(gens)]

    def memory_estimate(self, batch_size, shape):
        """The built model's fp32 weights, the feature maps a pass holds (the down blocks' skip connections,
        the widest block's activations) and one self-attention's scores over the full-size latent."""
        config = self._kwargs()
        tokens = shape["input_size"] ** 2
        width, heads = config["block_out_channels"][0], config["attention_head_dim"]
        heads = heads if isinstance(heads, int) else heads[0]
        return self.weight_bytes() + batch_size * (width * tokens * ACTIVATIONS + heads * tokens * tokens) * 4
