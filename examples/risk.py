"""Build the example risk-scoring bundle, then serve it.

    python examples/risk.py risk_bundle          # same as: offload example risk risk_bundle
    offload serve risk_bundle --port 8000        # OIP v2 at http://127.0.0.1:8000/v2/models/risk

See offload/examples/risk.py for the synthetic transactions and their 16 features.
"""

import sys

from offload.examples.risk import build_risk_bundle

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "risk_bundle"
    b = build_risk_bundle(out)
    print(f"wrote {out}: model {b.name!r}, AUC float {b.meta['auc_float']:.4f}, quantized {b.meta['auc_quantized']:.4f}")
