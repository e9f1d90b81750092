"""A small pre-LayerNorm transformer with a pluggable attention map.

`x <- x + Attn(LN(x))`, `x <- x + MLP(LN(x))` (MLP width x4, exact GELU), then `LN` and a
linear read-out, as in the paper's code. Causal or bidirectional. Positions (learned
embeddings initialized N(0, 1), like the token embeddings):
- `add`: token and position embeddings of the full width, summed;
- `concat`: a token embedding of width/2 and a position embedding of width/2, side by side;
- `none`; `rope`: rotary positions on q and k (not in the paper).
Parameters are float32 whatever `jax_enable_x64` says, for speed.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

from ..core._errors import PolarizeError, check_choice, check_positive
from .attention import AbstractAttention, make_attention

POSITIONS = ("add", "concat", "none", "rope")
F32 = jnp.float32


def rope(x: Float[Array, "heads seq dim"]) -> Float[Array, "heads seq dim"]:
    """Rotary positions: rotate pairs `(x_2m, x_2m+1)` by angle `t * 10000^(-2m/d)`."""
    _, n, d = x.shape
    freq = 10000.0 ** (-jnp.arange(0, d, 2, dtype=F32) / d)
    angle = jnp.arange(n, dtype=F32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(angle)[None], jnp.sin(angle)[None]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.reshape(x.shape)


class Attention(eqx.Module):
    """Multi-head attention whose weights come from the attention map `attend`."""

    qkv: eqx.nn.Linear
    out: eqx.nn.Linear
    gate: eqx.nn.Linear | None
    attend: AbstractAttention
    heads: int = eqx.field(static=True)
    use_rope: bool = eqx.field(static=True)

    def __init__(self, width: int, heads: int, norm: str, use_rope: bool, *, key: PRNGKeyArray):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        # one Linear for q, k and v: the same init (uniform, bound 1/sqrt(width)) as three
        self.qkv = eqx.nn.Linear(width, 3 * width, dtype=F32, key=k1)
        self.out = eqx.nn.Linear(width, width, dtype=F32, key=k2)
        self.attend = make_attention(norm, heads=heads, head_dim=width // heads, key=k4)
        gated = self.attend.output_gate
        self.gate = eqx.nn.Linear(width, width, dtype=F32, key=k3) if gated else None
        self.heads = heads
        self.use_rope = use_rope

    def __call__(
        self, x: Float[Array, "seq width"], mask: Bool[Array, "seq seq"]
    ) -> tuple[Float[Array, "seq width"], Float[Array, "heads seq seq"]]:
        n, width = x.shape
        q, k, v = jnp.split(jax.vmap(self.qkv)(x), 3, axis=-1)
        q, k, v = (t.reshape(n, self.heads, -1).transpose(1, 0, 2) for t in (q, k, v))
        if self.use_rope:
            q, k = rope(q), rope(k)
        a = self.attend(q, k, mask)
        o = jnp.einsum("hqk,hkd->qhd", a, v).reshape(n, width)
        if self.gate is not None:
            o = o * jax.nn.sigmoid(jax.vmap(self.gate)(x))
        return jax.vmap(self.out)(o), a


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attention: Attention
    ln2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, width: int, heads: int, norm: str, use_rope: bool, *, key: PRNGKeyArray):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1 = eqx.nn.LayerNorm(width, dtype=F32)
        self.attention = Attention(width, heads, norm, use_rope, key=k1)
        self.ln2 = eqx.nn.LayerNorm(width, dtype=F32)
        self.up = eqx.nn.Linear(width, 4 * width, dtype=F32, key=k2)
        self.down = eqx.nn.Linear(4 * width, width, dtype=F32, key=k3)

    def __call__(self, x: Float[Array, "seq width"], mask: Bool[Array, "seq seq"]):
        h, a = self.attention(jax.vmap(self.ln1)(x), mask)
        x = x + h
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(h), approximate=False)), a


class Transformer(eqx.Module):
    """Token ids `[seq]` to logits `[seq, out_vocab]`; `forward` also returns attention maps."""

    embed: eqx.nn.Embedding
    position: Float[Array, "max_len width"] | None
    blocks: tuple[Block, ...]
    ln: eqx.nn.LayerNorm
    unembed: eqx.nn.Linear
    causal: bool = eqx.field(static=True)
    concat: bool = eqx.field(static=True)

    def __init__(
        self,
        vocab: int,
        out_vocab: int,
        *,
        width: int = 128,
        layers: int = 2,
        heads: int = 1,
        norm: str = "softmax",
        causal: bool = True,
        positions: str = "add",
        max_len: int = 64,
        key: PRNGKeyArray,
    ):
        for name, value in [
            ("vocab", vocab),
            ("out_vocab", out_vocab),
            ("width", width),
            ("layers", layers),
            ("heads", heads),
            ("max_len", max_len),
        ]:
            check_positive(name, value, integer=True)
        check_choice("positions", positions, POSITIONS)
        if width % heads or (positions == "rope" and (width // heads) % 2):
            raise PolarizeError(
                f"`width` must be divisible by `heads` (into even head sizes for rope); "
                f"got width={width}, heads={heads}"
            )
        if positions == "concat" and width % 2:
            raise PolarizeError(f"`width` must be even with positions 'concat'; got {width}")
        keys = jax.random.split(key, layers + 3)
        token_width = width // 2 if positions == "concat" else width  # = position width
        self.embed = eqx.nn.Embedding(vocab, token_width, dtype=F32, key=keys[0])
        self.position = (
            jax.random.normal(keys[1], (max_len, token_width), F32)
            if positions in ("add", "concat")
            else None
        )
        self.concat = positions == "concat"
        self.blocks = tuple(Block(width, heads, norm, positions == "rope", key=k) for k in keys[3:])
        self.ln = eqx.nn.LayerNorm(width, dtype=F32)
        self.unembed = eqx.nn.Linear(width, out_vocab, dtype=F32, key=keys[2])
        self.causal = causal

    def forward(
        self, tokens: Int[Array, " seq"]
    ) -> tuple[Float[Array, "seq out"], Float[Array, "layers heads seq seq"]]:
        n = tokens.shape[0]
        x = jax.vmap(self.embed)(tokens)
        if self.position is not None and self.concat:
            x = jnp.concatenate([x, self.position[:n]], axis=-1)
        elif self.position is not None:
            x = x + self.position[:n]
        mask = jnp.tril(jnp.ones((n, n), bool)) if self.causal else jnp.ones((n, n), bool)
        maps = []
        for block in self.blocks:
            x, a = block(x, mask)
            maps.append(a)
        return jax.vmap(self.unembed)(jax.vmap(self.ln)(x)), jnp.stack(maps)

    def __call__(self, tokens: Int[Array, " seq"]) -> Float[Array, "seq out"]:
        return self.forward(tokens)[0]
