import os
import tempfile

# Keep C-simulation builds of a test run in one cache that survives across runs on this machine
# but never writes into the user's home on CI clones with odd permissions.
os.environ.setdefault("OFFLOAD_CACHE_DIR", os.path.join(tempfile.gettempdir(), "offload-cache"))
