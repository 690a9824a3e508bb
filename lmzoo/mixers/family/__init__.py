"""Parts shared by the mixers of one family, kept apart from any single variant.

- ``attention``: the softmax family's shared knobs (``AttentionConfig``), its scoring (position
  method, scale, log-n, window), its decoding cache and its base (``CacheMixer``: one forward
  for ``__call__`` and ``prefill``);
- ``linear``: the linear-attention family's base (``LinearFamilyMixer``: heads / mix / output over
  a matrix state per head), its gated form (``GatedMixer``) and the gated head norm;
- ``rwkv``: the RWKV time-mixing family's token shift, low-rank projections, per-head group norm and its
  base (``ShiftedMixer``: decoding carries the previous token beside the state);
- ``ssm``: the state-space family's causal conv block and the initialisation and checks of Δ.

A variant module imports from here (and from ``base``, ops, schema, registry, positions), never from
a sibling variant; a new variant of a family starts from its family's base.
"""
