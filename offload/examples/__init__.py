"""Worked examples that train a model and write its offload bundle (``risk``: the scoring MLP the service demo and tests use; ``dlrm``)."""
