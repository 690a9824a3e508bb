"""Parts shared by the mixers of one family, kept apart from any single variant.

- ``attention``: the softmax family's shared knobs (``AttentionConfig``), its scoring (position
  method, scale, log-n, window), its decoding cache and its base (``CacheMixer``: one forward
  for ``__call__`` and ``prefill``);
- ``linear``: the linear-attention family's base (``LinearFamilyMixer``: heads / mix / output over
  a matrix state per head), its gated form (``GatedMixer``) and the gated head norm;
- ``delta``: the delta-rule family's base (``DeltaRuleMixer``: short convs, unit q and k, beta, the
  Mamba-2-style decay, grouped value heads, KDA's sigmoid output gate);
- ``rwkv``: the RWKV time-mixing family's token shift, low-rank projections, per-head group norm and its
  base (``ShiftedMixer``: decoding carries the previous token beside the state);
- ``precond``: the preconditioned delta rule's base on ``delta``'s (``PrecondDeltaMixer``: the keys'
  running second moment and the write key it scales);
- ``ssm``: the state-space family's causal conv block and the initialisation and checks of Δ.

A variant module imports from here (and from ``base``, ops, schema, registry, positions), never from
a sibling variant; a new variant of a family starts from its family's base.
"""
