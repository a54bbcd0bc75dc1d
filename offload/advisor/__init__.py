"""The offload advisor: which candidates are worth a card, measured on their current device and
predicted for the card by an analytical model whose constants cite their sources.

Example::

    advice = offload.advise(model, (indices, offsets, dense), batch_sizes=(1, 64, 4096), card="u55c")
    advice.print()
"""

from offload.advisor.advise import Advice, Estimate, advise

__all__ = ["advise", "Advice", "Estimate"]
