"""PyTorch modules whose forward runs on the active offload device."""

from offload.nn.embedding import Embedding, EmbeddingBag, TableBatchedEmbeddingBags  # noqa: E402,F401
from offload.nn.ebc import EmbeddingBagCollection  # noqa: E402,F401  (torchrec is imported on use only)
from offload.nn.mlp import MLP  # noqa: E402,F401
from offload.nn.sharded import ShardedEmbeddingBagCollection  # noqa: E402,F401  (engines load on use)
