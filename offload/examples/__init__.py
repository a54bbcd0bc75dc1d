"""Worked examples that build offload bundles (the risk-scoring MLP used by the demo and the tests)."""
