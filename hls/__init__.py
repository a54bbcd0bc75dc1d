"""Layer 3: HLS C++ sources (``src/``, package data) and the code that generates, C-simulates
(g++ against ap_types) and builds (Vitis HLS, v++) kernel projects."""

# The built-in generators register themselves when their modules load.
from offload.hls import embedding, mlp  # noqa: F401
