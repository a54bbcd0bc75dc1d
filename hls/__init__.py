"""Layer 3: HLS C++ sources (``src/``, package data) and the code that generates, C-simulates
(g++ against ap_types) and builds (Vitis HLS, v++) kernel projects."""
