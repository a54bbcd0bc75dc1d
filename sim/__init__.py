"""Layer 1: fixed-point arithmetic with ap_fixed/ap_int semantics and bit-accurate reference models.

NumPy only: nothing here imports torch.
"""
