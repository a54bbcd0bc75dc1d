import os
import sys
import tempfile

# Keep C-simulation builds of a test run in one cache that survives across runs on this machine
# but never writes into the user's home on CI clones with odd permissions.
os.environ.setdefault("OFFLOAD_CACHE_DIR", os.path.join(tempfile.gettempdir(), "offload-cache"))

# The test folders mirror the packages (tests/sim, tests/host, ...) and share helpers that live
# here (_host_util, mlp_cases, fakes/): one import root for all of them.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
