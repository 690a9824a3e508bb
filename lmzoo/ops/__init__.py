"""Pure array functions (no parameters) for every sequence-mixing computation.

Every op names its computation form with ``method``, from one vocabulary (``common.Forms``, each op's
``METHODS``): ``"naive"`` is each op's plainly readable reference (for the recurrences, the recurrence
written out step by step), which the fast forms are tested against; ``"scan"`` is always a fast form.
An op takes only today's names; the names older runs saved ("scan" for a reference, "blockwise", "dense",
H3's "quadratic") are renamed, with a one-line note, where a saved run is read (``lmzoo.record.migrate``).
Shared pieces (the causal mask, chunk padding, segment sums) are in ``common``.

Axis legend used across ``lmzoo.ops``: B batch, T query time, S key time, H query heads,
K key/value heads, D head dim. Per-head tensors are laid out ``[B, T, H, D]``.
Linear-attention family: Dk / Dv key / value head dims (state ``[B, H, Dk, Dv]``), N chunks of C steps;
the delta rule's ``delta_rule`` has a step size beta ``[B, T, HV]`` over HV value heads (a multiple of the H query/key
heads: grouped value heads, as KDA); ``dplr`` is the diagonal-plus-low-rank transition of RWKV-7, of which the delta
rule, KDA and GDN-2 are special cases; ``rwkv6`` is GLA read before each step's decay and write, with a bonus ``u
[H, Dk]`` on the token's own key; ``mlstm`` (xLSTM) has an exponential input gate, a normaliser state n [B, H, Dk]
and a stabiliser m [B, H] beside C.
Gated slot attention (``gsa``): M memory slots per head, one forget gate each (``[B, T, H, M]``), two states
``[B, H, Dk, M]`` (the slots' keys) and ``[B, H, M, Dv]`` (their values).
Log-linear attention: L levels (``level_scales [B, T, H, L]``), state ``[B, H, L-1, Dk, Dv]`` (one matrix per
Fenwick level), ``start`` the first token's position in its document.
PaTH: w unit Householder directions ``[B, T, H, D]``, beta ``[B, T, H]`` in (0, 2).
DeltaFormer: write queries w ``[B, T, K, D]`` (the keys by default), written values u ``[B, T, K, Dv]``; its state
is a cache of every token's key and u. MoBA: blocks of bs tokens from each document's start, topk chosen per query
(``block_indices [B, T, H, topk]``, its own block first).
VQ attention: S codewords per head (codebook ``[H, S, D]``), blocks of L queries.
State-space family: D channels (``selective_scan``, state ``[B, D, N]``), P head size (``ssd``, state
``[B, H, P, N]``), N state size, G groups sharing the B/C projections.

Which ops each mixer computes with: ``MIXER_OPS`` below (checked against the mixers' imports).
One-token decoding (a mixer's ``step``) has one name: a recurrent op's ``STEP_FORM`` is the form mixers decode
with, and an op that decodes from a cache has a one-token function ``<op>_step`` (``nsa_step``, ``vq_step`` ...).
"""

from lmzoo.ops.attention import attention_weights, logn_scale, softmax_attention
from lmzoo.ops.comba import comba, comba_weights
from lmzoo.ops.common import causal_mask
from lmzoo.ops.delta import delta_rule, delta_rule_weights
from lmzoo.ops.deltaformer import deltaformer, deltaformer_step, deltaformer_weights
from lmzoo.ops.delta_product import delta_product, delta_product_weights
from lmzoo.ops.dplr import dplr, dplr_weights, gdn2, gdn2_weights
from lmzoo.ops.dsa import dsa, dsa_indexer, dsa_weights
from lmzoo.ops.gated import gla, gla_weights
from lmzoo.ops.gsa import gsa, gsa_weights
from lmzoo.ops.linear import linear_attention, linear_attention_weights
from lmzoo.ops.mamba3 import mamba3, mamba3_attention
from lmzoo.ops.mlstm import mlstm, mlstm_weights
from lmzoo.ops.moba import moba, moba_blocks, moba_step, moba_weights
from lmzoo.ops.log_linear import log_linear_attention, log_linear_step, log_linear_weights
from lmzoo.ops.path import path_attention, path_matrix, reflect_keys
from lmzoo.ops.rwkv6 import rwkv6, rwkv6_weights
from lmzoo.ops.mesa import mesa_net, mesa_net_weights
from lmzoo.ops.momentum_delta import momentum_delta_rule, momentum_delta_rule_weights
from lmzoo.ops.precond_delta import precond_delta_rule, precond_delta_rule_weights
from lmzoo.ops.nsa import nsa, nsa_block_means, nsa_compression, nsa_selection, nsa_topk, nsa_weights
from lmzoo.ops.lti import causal_conv1d, diagonal_ssm, diagonal_ssm_kernel, fft_conv
from lmzoo.ops.selective_scan import selective_attention, selective_scan
from lmzoo.ops.ssd import ssd, ssd_attention
from lmzoo.ops.titans import titans, titans_step, titans_weights
from lmzoo.ops.ttt import ttt_linear, ttt_linear_step, ttt_linear_weights
from lmzoo.ops.stick_breaking import stick_breaking_attention, stick_breaking_matrix, stick_breaking_weights
from lmzoo.ops.vq import vq_attention, vq_step

__all__ = ["attention_weights", "causal_mask", "logn_scale", "softmax_attention", "vq_attention", "vq_step"]
__all__ += ["delta_rule", "delta_rule_weights", "gla", "gla_weights", "linear_attention", "linear_attention_weights"]
__all__ += ["causal_conv1d", "diagonal_ssm", "diagonal_ssm_kernel", "fft_conv"]
__all__ += ["selective_attention", "selective_scan", "ssd", "ssd_attention"]
__all__ += ["dsa", "dsa_indexer", "dsa_weights"]
__all__ += ["moba", "moba_blocks", "moba_step", "moba_weights"]
__all__ += ["nsa", "nsa_block_means", "nsa_compression", "nsa_selection", "nsa_topk", "nsa_weights"]
__all__ += ["path_attention", "path_matrix", "reflect_keys"]
__all__ += ["stick_breaking_attention", "stick_breaking_matrix", "stick_breaking_weights"]
__all__ += ["log_linear_attention", "log_linear_step", "log_linear_weights"]
__all__ += ["dplr", "dplr_weights", "gdn2", "gdn2_weights", "rwkv6", "rwkv6_weights", "mlstm", "mlstm_weights"]
__all__ += ["comba", "comba_weights", "delta_product", "delta_product_weights", "mamba3", "mamba3_attention"]
__all__ += ["mesa_net", "mesa_net_weights", "deltaformer", "deltaformer_step", "deltaformer_weights"]
__all__ += ["gsa", "gsa_weights"]
__all__ += ["momentum_delta_rule", "momentum_delta_rule_weights", "precond_delta_rule", "precond_delta_rule_weights"]
__all__ += ["titans", "titans_step", "titans_weights", "ttt_linear", "ttt_linear_step", "ttt_linear_weights"]

# The op modules (lmzoo/ops/<name>.py) each mixer module (lmzoo/mixers/<name>.py, registered under the same name)
# computes with: those it imports, or, where it imports none, those of the family base whose mixer it builds or extends
# (lmzoo/mixers/family/). The shared pieces (common, kernels, pallas) are left out. The configs/attn files that
# name another schema run that schema's mixer (gqa, mqa, swa, logn, keynorm, gated_softmax: softmax; the hybrids:
# hybrid, which builds registered mixers layer by layer). tests/ops/test_mixer_ops.py checks the table.
MIXER_OPS = {
    "family.attention": ("attention",),
    "family.linear": ("gated",),
    "family.delta": ("delta",),
    "family.precond": ("precond_delta",),
    "family.ssm": ("ssd", "lti"),  # lti: the short causal conv before the SSM
    "family.rwkv": (),  # token shift and the shared projections: no op of its own
    "family.inner": (),  # projections, inner norm and decoding state: the variants name their ops
    # the softmax family
    "softmax": ("attention",),
    "fox": ("attention",),
    "gau": ("attention",),
    "mla": ("attention",),
    "dsa": ("dsa",),
    "nsa": ("nsa",),
    "moba": ("moba",),
    "deltaformer": ("deltaformer",),
    "path": ("path", "attention"),  # attention: grouped key/value heads
    "stickbreaking": ("stick_breaking", "attention"),
    "vq": ("vq",),
    # the linear family
    "linear": ("linear",),
    "gla": ("gated",),
    "retnet": ("gated",),
    "hgrn2": ("gated",),
    "lightning": ("gated",),
    "gsa": ("gsa",),
    "deltanet": ("delta",),
    "gated_deltanet": ("delta",),
    "kda": ("delta",),
    "comba": ("comba",),
    "momentum_deltanet": ("momentum_delta",),
    "mesanet": ("mesa",),
    "precond_gated_deltanet": ("precond_delta",),
    "precond_kda": ("precond_delta",),
    "deltaproduct": ("delta_product",),
    "gdn2": ("dplr",),
    "rwkv7": ("dplr",),
    "rwkv6": ("rwkv6",),
    "mlstm": ("mlstm",),
    # the test-time-training family
    "ttt_linear": ("ttt",),
    "titans": ("titans",),
    # the state-space family
    "mamba": ("selective_scan",),
    "mamba2": ("ssd",),
    "mamba3": ("mamba3",),
    "log_linear_mamba2": ("log_linear",),
    "h3": ("lti",),
    "hybrid": (),  # none of its own: the mixers it interleaves
}
