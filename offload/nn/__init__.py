"""PyTorch modules whose forward runs on the active offload device."""
