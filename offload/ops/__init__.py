"""The ``torch.ops.offload.*`` custom ops and the resident-kernel table they run against.

Importing a module here registers its ops with torch.library: ``embedding`` registers
``embedding_lookup`` and ``embedding_lookup_tbe``, ``mlp`` registers ``mlp_score``; ``resident``
holds the kernels the ops refer to by integer id (torch ops cannot take Python objects).
"""
