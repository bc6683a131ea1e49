"""DiT modules over perftrain's fused ops: `from perftrain.nn import DiT` for `from models import DiT`.

The modules take facebookresearch/DiT's `models.py` names, shapes, initialisation and semantics
(TimestepEmbedder, LabelEmbedder with the extra "no class" row, the fixed sin-cos `pos_embed`,
learn_sigma, adaLN-Zero; `DiT_models` with DiT-S/B/L/XL x 2/4/8), so its checkpoints load with
`load_state_dict(strict=True)` both ways; `SingleStreamBlock` takes the names of perftrain's
single-stream block (src/models/single_stream.h). The forward runs each block line through
`perftrain.ops` (docs/design.md, "A DiT block, line by line"):

    modulation   silu(c) once, then each block's adaLN linear
    norm1        adaln_layernorm(x, shift_msa, scale_msa)           -> h, in the compute dtype
    attention    the qkv product and attention, proj without its bias
    residual     residual_adaln(x, gate_msa, attn, shift_mlp, scale_mlp, bias=proj.bias) -> x1, h2
    MLP          gelu_mlp: fc1 + bias + GELU in one product, fc2 without its bias
    residual     gated_residual(x1, gate_mlp, mlp, fc2.bias), or in a chain of blocks
                 residual_adaln with the NEXT block's norm1 (or the final layer's norm)

so that in `DiT.forward` (and `dit_blocks_chained`) the residual stream is written once per
half-block and each block's output arrives in the layout the next block's fused norm reads.
The residual stream stays fp32; the products run in the compute dtype: autocast's (bf16 under
`torch.autocast("cuda", torch.bfloat16)`) or the input's. The chained forward calls the blocks'
pieces, not `block(x, c)`: hooks registered on a block do not fire inside `DiT.forward`.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ops

__all__ = ["TimestepEmbedder", "LabelEmbedder", "PatchEmbed", "Attention", "Mlp", "DiTBlock", "FinalLayer",
           "DiT", "DiT_models", "dit_blocks_chained", "stacked_modulations", "get_2d_sincos_pos_embed", "compute_dtype",
           "RMSNorm", "SingleStreamAttention", "SwiGLU", "SingleStreamBlock", "single_stream_blocks_chained",
           "rope_tables"]


def compute_dtype(x):
    """The dtype the products run in: autocast's on x's device where it is on, else x's."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


def compute_copy(p, dtype):
    """The optimizer's copy of p in dtype (DeviceAdamW's bf16 copies), or None. The ops take it beside
    p (ops.linear's weight_copy, ops.gelu_mlp's w1_copy and w2_copy): the product reads the copy, the
    backward writes p's gradient in p's dtype straight from its product."""
    copy = getattr(p, "_perftrain_compute_copy", None)
    return copy if copy is not None and copy.dtype == dtype else None


def compute_weight(p, dtype):
    """p in the products' dtype, for a product that is not a perftrain op (SwiGLU's gate and up): the
    optimizer's copy of it when one is attached, with the gradient going to p; else p.to(dtype)."""
    copy = compute_copy(p, dtype)
    if copy is not None:
        return _ComputeCopy.apply(p, copy)
    return p.to(dtype)


class _ComputeCopy(torch.autograd.Function):
    """Forward: the attached low-precision copy of a master weight; backward: the gradient to the master."""

    @staticmethod
    def forward(master, copy):
        return copy.view_as(copy)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.master_dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.master_dtype), None


def _linear(x, layer, with_bias=True):
    """layer's product on x in x's dtype (the compute dtype), its bias added when with_bias: ops.linear on
    the fp32 weight and its copy (gradients written in fp32 from the products)."""
    bias = layer.bias if with_bias else None
    return ops.linear(x, layer.weight, bias, weight_copy=compute_copy(layer.weight, x.dtype))


def stacked_modulations(layers, silu_c, pieces):
    """The adaLN modulations of several blocks, which all read silu_c [B, D] (compute dtype), as one
    product (ops.stacked_linear: one product of B rows instead of one per block, forward and backward),
    each layer's output chunked into `pieces` [B, D] tensors -> one tuple per layer."""
    dt = silu_c.dtype
    weights = [l.weight for l in layers]
    biases = [l.bias for l in layers] if layers[0].bias is not None else []
    weight_copies = [compute_copy(w, dt) for w in weights]
    bias_copies = [compute_copy(b, dt) for b in biases]
    y = ops.stacked_linear(silu_c, weights, biases,
                           weight_copies=weight_copies if None not in weight_copies else None,
                           bias_copies=bias_copies if biases and None not in bias_copies else None)
    chunks = y.chunk(pieces * len(layers), dim=1)
    return [chunks[pieces * i:pieces * (i + 1)] for i in range(len(layers))]


# ----------------------------------------------------------------------------
# Embeddings (facebookresearch/DiT models.py)
# ----------------------------------------------------------------------------


def _sincos_1d(dim, pos):
    """pos [M] (float64) -> [M, dim]: dim/2 sines then dim/2 cosines of pos * 10000^(-2i/dim)."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
    angles = pos.reshape(-1, 1).double() * omega[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    """[grid_size**2, embed_dim] float64, DiT's (MAE's) fixed 2-D embedding: the first half of the
    channels encodes the column of token k = row * grid_size + column, the second half its row."""
    if embed_dim % 4:
        raise ValueError(f"pos_embed: hidden size {embed_dim} must be divisible by 4")
    idx = torch.arange(grid_size, dtype=torch.float64)
    rows, cols = torch.meshgrid(idx, idx, indexing="ij")
    return torch.cat([_sincos_1d(embed_dim // 2, cols), _sincos_1d(embed_dim // 2, rows)], dim=1)


class PatchEmbed(nn.Module):
    """timm's PatchEmbed as DiT uses it: a strided convolution, tokens row-major -> [B, T, D];
    patch_size and grid_size are (h, w) pairs, as timm's (DiT reads x_embedder.patch_size[0])."""

    def __init__(self, img_size, patch_size, in_chans, embed_dim, bias=True):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, bias=bias)

    def forward(self, x):
        """x [B, C, H, W] -> [B, T, D] in the compute dtype: the convolution as the product the C++ trainer
        runs (nn/embeddings.cpp's forward_as_product): each token's patch gathered in the weight's (c, i, j)
        order and cast in one copy, then ops.linear on the flattened weight (and its bf16 copy)."""
        act = compute_dtype(x)
        b, c, h, w = x.shape
        p = self.patch_size[0]
        gh, gw = h // p, w // p
        patches = x.new_empty((b, gh, gw, c, p, p), dtype=act)
        patches.copy_(x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5))
        weight = self.proj.weight
        copy = compute_copy(weight, act)
        return ops.linear(patches.view(b, gh * gw, c * p * p), weight.view(weight.shape[0], -1), self.proj.bias,
                          weight_copy=copy.view(copy.shape[0], -1) if copy is not None else None)


class TimestepEmbedder(nn.Module):
    """Scalar timesteps -> [B, D]: 256 sinusoidal frequencies through Linear, SiLU, Linear."""

    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size, bias=True), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size, bias=True))
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        """t [B] -> [B, dim] float32: cos then sin of t * max_period^(-i/half), zero-padded to an odd dim."""
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t):
        """t [B] -> [B, D] in the compute dtype, the two products through ops.linear (and the bf16 copies)."""
        freq = self.timestep_embedding(t, self.frequency_embedding_size)
        freq = freq.to(compute_dtype(freq))
        return _linear(F.silu(_linear(freq, self.mlp[0])), self.mlp[2])


class LabelEmbedder(nn.Module):
    """Class labels -> [B, D]; with dropout_prob > 0 the table has a last row, the "no class" label
    that training substitutes with probability dropout_prob (classifier-free guidance)."""

    def __init__(self, num_classes, hidden_size, dropout_prob):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def token_drop(self, labels, force_drop_ids=None):
        if force_drop_ids is None:
            drop_ids = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
        else:
            drop_ids = force_drop_ids == 1
        return torch.where(drop_ids, self.num_classes, labels)

    def forward(self, labels, train, force_drop_ids=None):
        if (train and self.dropout_prob > 0) or force_drop_ids is not None:
            labels = self.token_drop(labels, force_drop_ids)
        return self.embedding_table(labels)


# ----------------------------------------------------------------------------
# DiT block
# ----------------------------------------------------------------------------


class Attention(nn.Module):
    """timm's Attention as DiT builds it (qkv with bias, proj; no q/k norm): names attn.qkv, attn.proj."""

    def __init__(self, dim, num_heads=8, qkv_bias=True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Attention: hidden size {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def attend(self, h):
        """h [B, T, D] (compute dtype) -> the attention before proj, [B, T, D]."""
        return ops.attention(_linear(h, self.qkv), self.num_heads)

    def forward(self, x):
        return _linear(self.attend(x), self.proj)


class Mlp(nn.Module):
    """timm's Mlp with DiT's tanh GELU: names mlp.fc1, mlp.fc2."""

    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.fc2 = nn.Linear(hidden_features, in_features)

    def branch(self, h, with_bias=False):
        """fc2(gelu(fc1(h))), without fc2's bias unless with_bias (in a block the residual after it adds
        it): ops.gelu_mlp on the fp32 weights and their copies."""
        fc1, fc2 = self.fc1, self.fc2
        return ops.gelu_mlp(h, fc1.weight, fc1.bias, fc2.weight, fc2.bias if with_bias else None,
                            w1_copy=compute_copy(fc1.weight, h.dtype), w2_copy=compute_copy(fc2.weight, h.dtype))

    def forward(self, x):
        return self.branch(x, with_bias=True)


class DiTBlock(nn.Module):
    """adaLN-Zero DiT block: x + gate * attn(modulate(norm1(x))), then the same with the MLP."""

    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def modulation(self, silu_c):
        """silu(c) in the compute dtype -> (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp)."""
        return _linear(silu_c, self.adaLN_modulation[1]).chunk(6, dim=1)

    def open(self, x, mod, act):
        """norm1 of the residual stream x, modulated, in act."""
        return ops.adaln_layernorm(x, mod[0], mod[1], act, self.norm1.eps)

    def attention_half(self, x, h, mod, act):
        """The attention branch on h = open(x) and its residual, added with norm2 -> (x1, h2)."""
        a = _linear(self.attn.attend(h), self.attn.proj, with_bias=False)
        return ops.residual_adaln(x, mod[2], a, mod[3], mod[4], act, self.norm2.eps, self.attn.proj.bias)

    def forward(self, x, c):
        act = compute_dtype(x)
        mod = self.modulation(F.silu(c).to(act))
        x1, h2 = self.attention_half(x, self.open(x, mod, act), mod, act)
        return ops.gated_residual(x1, mod[5], self.mlp.branch(h2), self.mlp.fc2.bias)


class FinalLayer(nn.Module):
    """The final adaLN LayerNorm and linear to patch * patch * out_channels per token."""

    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def modulation(self, silu_c):
        return _linear(silu_c, self.adaLN_modulation[1]).chunk(2, dim=1)

    def close(self, x1, gate, y, bias, silu_c, act):
        """The last block's pending residual x1 + gate * (y + bias) added with this layer's norm, then
        the linear: the residual stream itself is never written."""
        shift, scale = self.modulation(silu_c)
        _, h = ops.residual_adaln(x1, gate, y, shift, scale, act, self.norm_final.eps, bias)
        return _linear(h, self.linear)

    def forward(self, x, c):
        act = compute_dtype(x)
        shift, scale = self.modulation(F.silu(c).to(act))
        return _linear(ops.adaln_layernorm(x, shift, scale, act, self.norm_final.eps), self.linear)


def dit_blocks_chained(blocks, x, c, final_layer=None):
    """blocks (non-empty) on the residual stream x [B, T, D] with condition c [B, D]: each block's MLP
    residual added together with the next block's norm1 (ops.residual_adaln), the last one's with the
    final layer's norm when final_layer is given (-> its output [B, T, p*p*C]), else alone (-> [B, T, D])."""
    if len(blocks) == 0:
        raise ValueError("dit_blocks_chained: no blocks")
    act = compute_dtype(x)
    silu_c = F.silu(c).to(act)
    mods = stacked_modulations([b.adaLN_modulation[1] for b in blocks], silu_c, 6)
    h = blocks[0].open(x, mods[0], act)
    for i, block in enumerate(blocks):
        x1, h2 = block.attention_half(x, h, mods[i], act)
        y, bias, gate = block.mlp.branch(h2), block.mlp.fc2.bias, mods[i][5]
        if i + 1 < len(blocks):
            nxt = mods[i + 1]
            x, h = ops.residual_adaln(x1, gate, y, nxt[0], nxt[1], act, blocks[i + 1].norm1.eps, bias)
        elif final_layer is not None:
            return final_layer.close(x1, gate, y, bias, silu_c, act)
        else:
            return ops.gated_residual(x1, gate, y, bias)


class DiT(nn.Module):
    """Diffusion model with a transformer backbone: facebookresearch/DiT's `DiT`, same arguments."""

    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                 mlp_ratio=4.0, class_dropout_prob=0.1, num_classes=1000, learn_sigma=True):
        super().__init__()
        if input_size % patch_size:
            raise ValueError(f"DiT: input_size {input_size} is not divisible by patch_size {patch_size}")
        if depth < 1:
            raise ValueError(f"DiT: depth must be >= 1, got {depth}")
        self.learn_sigma = learn_sigma
        self.in_channels = in_channels
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.patch_size = patch_size
        self.num_heads = num_heads

        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        num_patches = self.x_embedder.num_patches
        # Fixed sin-cos embedding: a parameter that is never trained (DiT's; it is in the state dict).
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, hidden_size), requires_grad=False)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)])
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self):
        def _basic_init(module):
            if isinstance(module, nn.Linear):
                torch.nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.constant_(module.bias, 0)
        self.apply(_basic_init)
        if not self.pos_embed.is_meta:
            pe = get_2d_sincos_pos_embed(self.pos_embed.shape[-1], self.x_embedder.grid_size[0])
            self.pos_embed.data.copy_(pe.float().unsqueeze(0))
        w = self.x_embedder.proj.weight.data
        nn.init.xavier_uniform_(w.view([w.shape[0], -1]))
        nn.init.constant_(self.x_embedder.proj.bias, 0)
        nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks:  # adaLN-Zero
            nn.init.constant_(block.adaLN_modulation[-1].weight, 0)
            nn.init.constant_(block.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].weight, 0)
        nn.init.constant_(self.final_layer.adaLN_modulation[-1].bias, 0)
        nn.init.constant_(self.final_layer.linear.weight, 0)
        nn.init.constant_(self.final_layer.linear.bias, 0)

    def unpatchify(self, x):
        """x [B, T, p*p*C] -> imgs [B, C, H, W]."""
        c, p = self.out_channels, self.x_embedder.patch_size[0]
        h, w = self.x_embedder.grid_size
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x, t, y):
        """x [B, C, H, W] latents, t [B] timesteps, y [B] labels -> [B, out_channels, H, W]."""
        # The fp32 residual stream, row-major [B, T, D] (the patch embedding's transpose is not; the ops
        # read rows, and an op given a strided stream returns it in another layout than its fake says).
        x = (self.x_embedder(x) + self.pos_embed).contiguous()
        c = self.t_embedder(t) + self.y_embedder(y, self.training)
        return self.unpatchify(dit_blocks_chained(self.blocks, x, c, self.final_layer))

    def forward_with_cfg(self, x, t, y, cfg_scale):
        """Classifier-free guidance on the first three channels, as DiT's: the batch's second half holds
        the "no class" labels and its first half is repeated."""
        half = x[: len(x) // 2]
        model_out = self.forward(torch.cat([half, half], dim=0), t, y)
        eps, rest = model_out[:, :3], model_out[:, 3:]
        cond_eps, uncond_eps = torch.split(eps, len(eps) // 2, dim=0)
        half_eps = uncond_eps + cfg_scale * (cond_eps - uncond_eps)
        return torch.cat([torch.cat([half_eps, half_eps], dim=0), rest], dim=1)


def _dit_config(depth, hidden_size, patch_size, num_heads):
    def make(**kwargs):
        return DiT(depth=depth, hidden_size=hidden_size, patch_size=patch_size, num_heads=num_heads, **kwargs)
    return make


# name -> constructor taking DiT's other keyword arguments, as models.py's DiT_models.
DiT_models = {f"DiT-{size}/{p}": _dit_config(d, h, p, n)
              for size, (d, h, n) in {"XL": (28, 1152, 16), "L": (24, 1024, 16), "B": (12, 768, 12),
                                      "S": (12, 384, 6)}.items()
              for p in (2, 4, 8)}


# ----------------------------------------------------------------------------
# Single-stream block (src/models/single_stream.h)
# ----------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """rms(x) * weight, statistics in fp32: name `weight`."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return ops.rms_adaln(x, self.weight, None, x.dtype, self.eps)


def rope_tables(positions, head_dim, theta=10000.0):
    """positions [T, 3] (three axes per token) -> cos, sin [T, head_dim/2] float32, as the single-stream
    model builds them: the head dimension split over the axes (the first gets what the other two leave),
    frequencies theta^(-2k/d) per axis, computed in float64."""
    spatial = 2 * ((head_dim * 3) // 16)
    pos = torch.as_tensor(positions, dtype=torch.float64)
    angles = []
    for axis, d in enumerate((head_dim - 2 * spatial, spatial, spatial)):
        k = torch.arange(d // 2, dtype=torch.float64)
        angles.append(pos[:, axis:axis + 1] * theta ** (-2.0 * k / d)[None])
    a = torch.cat(angles, dim=1)
    return a.cos().float(), a.sin().float()


class SingleStreamAttention(nn.Module):
    """qkv (no bias), QK-norm over the head dimension, rotary embedding, attention, proj (no bias)."""

    def __init__(self, hidden, heads):
        super().__init__()
        if hidden % heads or (hidden // heads) % 2:
            raise ValueError(f"SingleStreamAttention: hidden {hidden} / heads {heads} must be an even integer")
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.q_norm = RMSNorm(hidden // heads)
        self.k_norm = RMSNorm(hidden // heads)
        self.proj = nn.Linear(hidden, hidden, bias=False)

    def attend(self, h, cos, sin, mask=None):
        """h [B, S, D] compute dtype -> attention before proj [B, S, D]; mask [B, 1, 1, S] keys (True: kept)."""
        packed = ops.qk_norm_rope(_linear(h, self.qkv), self.heads, self.q_norm.weight, self.k_norm.weight, cos, sin,
                                  self.q_norm.eps)
        return ops.attention(packed, self.heads, mask)

    def forward(self, h, cos, sin, mask=None):
        return _linear(self.attend(h, cos, sin, mask), self.proj)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up in one product: names ffn.gate, ffn.up, ffn.down."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, h):
        gate_up = F.linear(h, torch.cat([compute_weight(self.gate.weight, h.dtype),
                                         compute_weight(self.up.weight, h.dtype)]))
        return _linear(ops.swiglu(gate_up), self.down)


class SingleStreamBlock(nn.Module):
    """A block of perftrain's single-stream DiT: RMSNorm with adaLN scale (no shift), sandwich post-norms,
    tanh gates from the timestep: x + tanh(g1) * post(attn(norm(x) * (1 + s1))), then the same with SwiGLU.
    forward(x, silu_c, cos, sin, mask=None): silu(c) [B, D] (the caller's, once for all blocks)."""

    def __init__(self, hidden, heads, mlp_hidden):
        super().__init__()
        self.attn_norm = RMSNorm(hidden)
        self.attn = SingleStreamAttention(hidden, heads)
        self.attn_post_norm = RMSNorm(hidden)
        self.ffn_norm = RMSNorm(hidden)
        self.ffn = SwiGLU(hidden, mlp_hidden)
        self.ffn_post_norm = RMSNorm(hidden)
        self.adaLN_modulation = nn.Linear(hidden, 4 * hidden, bias=False)

    def modulation(self, silu_c):
        """-> (attn_scale, attn_gate, ffn_scale, ffn_gate), each [B, D]."""
        return _linear(silu_c, self.adaLN_modulation).chunk(4, dim=1)

    def open(self, x, mod, act):
        return ops.rms_adaln(x, self.attn_norm.weight, mod[0], act, self.attn_norm.eps)

    def attention_half(self, x, h, mod, act, cos, sin, mask):
        """The attention branch on h = open(x), its post-norm and gated residual added with the FFN's
        pre-norm -> (x1, h2)."""
        a = self.attn(h, cos, sin, mask)
        return ops.residual_rms_adaln(x, mod[1], a, self.attn_post_norm.weight, self.ffn_norm.weight, mod[2], act,
                                      self.ffn_norm.eps)

    def forward(self, x, silu_c, cos, sin, mask=None):
        return single_stream_blocks_chained([self], x, silu_c, cos, sin, mask)


def single_stream_blocks_chained(blocks, x, silu_c, cos, sin, mask=None):
    """Single-stream blocks (non-empty) on x [B, S, D]: each FFN residual added together with the next
    block's pre-norm (ops.residual_rms_adaln) -> the last block's output [B, S, D] in x's dtype."""
    if len(blocks) == 0:
        raise ValueError("single_stream_blocks_chained: no blocks")
    act = compute_dtype(x)
    silu_c = silu_c.to(act)
    mods = stacked_modulations([b.adaLN_modulation for b in blocks], silu_c, 4)
    h = blocks[0].open(x, mods[0], act)
    for i, block in enumerate(blocks):
        x1, h2 = block.attention_half(x, h, mods[i], act, cos, sin, mask)
        y, post = block.ffn(h2), block.ffn_post_norm.weight
        if i + 1 < len(blocks):
            nxt = blocks[i + 1]
            x, h = ops.residual_rms_adaln(x1, mods[i][3], y, post, nxt.attn_norm.weight, mods[i + 1][0], act,
                                          nxt.attn_norm.eps)
        else:
            return ops.residual_rms_adaln(x1, mods[i][3], y, post, None, None, act, block.ffn_post_norm.eps)[0]
