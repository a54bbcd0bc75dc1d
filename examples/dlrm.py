"""DLRM-style recommender: embedding tables offloaded (sim device by default), dense part on the host.

    python examples/dlrm.py --small          # 10^3..10^4-row tables, ~10 s
    python examples/dlrm.py                  # 10^4..10^6-row tables at dim 32 (325 MiB of float tables)
    python examples/dlrm.py --device emu     # the HLS kernel compiled with g++ instead of the simulator

The model, data and comparison live in ``offload.examples.dlrm``.
"""

from offload.examples.dlrm import main

if __name__ == "__main__":
    main()
