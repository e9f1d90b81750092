"""Data generators for the two tasks of the paper (4.1 induction, 4.2 classification).

Every generator takes an explicit key and returns int32 arrays, so a dataset is a pure
function of its key.
"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int, PRNGKeyArray

from ..core._errors import PolarizeError, check_positive


def induction_vocab(vocab: int, shift_query: bool) -> int:
    """Input (and output) vocabulary size: `vocab` ids (BOS = 0 among them), doubled
    when the query token is shifted, as in the paper's code."""
    return 2 * vocab if shift_query else vocab


def induction(
    key: PRNGKeyArray, n: int, *, vocab: int = 50, length: int = 10, shift_query: bool = True
) -> tuple[Int[Array, "n seq"], Int[Array, "n seq"]]:
    """The paper's sequences `[BOS, t_1..t_length, q, answer]` with BOS = 0 and the `t_i`
    distinct in `1..vocab-1`.

    `k` is uniform in `1..length`, `q = t_k` (`+ vocab` with `shift_query`) and the answer
    is the token after `t_k`, that is `t_k+1`, or `q` itself when `k = length` (so the
    sequence is `[BOS] + t + [q]` read one step further, as the paper's data set does).
    Returns next-token `(inputs, targets) = (seq[:-1], seq[1:])`; the answer is
    `targets[:, -1]`.
    """
    check_positive("n", n, integer=True)
    if length < 2 or length > vocab - 1:
        raise PolarizeError(f"`length` must be in 2..vocab-1={vocab - 1}; got {length}")
    k_tok, k_pos = jax.random.split(key)
    tokens = 1 + jax.vmap(lambda k: jax.random.choice(k, vocab - 1, (length,), replace=False))(
        jax.random.split(k_tok, n)
    ).astype(jnp.int32)
    pos = jax.random.randint(k_pos, (n, 1), 0, length)
    query = jnp.take_along_axis(tokens, pos, axis=1) + (vocab if shift_query else 0)
    answer = jnp.take_along_axis(jnp.concatenate([tokens, query], axis=1), pos + 1, axis=1)
    bos = jnp.zeros((n, 1), jnp.int32)
    seq = jnp.concatenate([bos, tokens, query, answer], axis=1).astype(jnp.int32)
    return seq[:, :-1], seq[:, 1:]


def classification(
    key: PRNGKeyArray,
    n: int,
    *,
    groups: int = 4,
    per_group: int = 10,
    length: int = 10,
    labels: Int[Array, " n"] | None = None,
) -> tuple[Int[Array, "n seq"], Int[Array, " n"]]:
    """Sequences of `length` distinct tokens from the label's group, then CLS; the labels
    are uniform unless given.

    Group `g` owns tokens `g*per_group .. (g+1)*per_group - 1`; CLS is `groups*per_group`.
    """
    check_positive("n", n, integer=True)
    if length > per_group:
        raise PolarizeError(f"`length` must be at most per_group={per_group}; got {length}")
    k_lab, k_tok = jax.random.split(key)
    if labels is None:
        labels = jax.random.randint(k_lab, (n,), 0, groups)
    labels = jnp.asarray(labels).astype(jnp.int32)
    pick = jax.vmap(lambda k: jax.random.choice(k, per_group, (length,), replace=False))(
        jax.random.split(k_tok, n)
    ).astype(jnp.int32)
    cls = jnp.full((n, 1), groups * per_group, jnp.int32)
    tokens = jnp.concatenate([labels[:, None] * per_group + pick, cls], axis=1)
    return tokens, labels


def single_token_attack(
    key: PRNGKeyArray,
    tokens_a: Int[Array, "n seq"],
    tokens_b: Int[Array, "n seq"],
    cls_attention_a: Array,
) -> Int[Array, "n seq"]:
    """Put the most-attended token of each A sequence in place of a random token of B.

    `cls_attention_a[n, seq]` is the CLS row of A's attention; the CLS position itself
    (the last) is never chosen or replaced.
    """
    body = cls_attention_a[:, :-1]
    top = jnp.take_along_axis(tokens_a, jnp.argmax(body, axis=1)[:, None], axis=1)
    where = jax.random.randint(key, (tokens_b.shape[0],), 0, tokens_b.shape[1] - 1)
    hit = jnp.arange(tokens_b.shape[1])[None, :] == where[:, None]
    return jnp.where(hit, top, tokens_b).astype(jnp.int32)
