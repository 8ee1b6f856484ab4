"""Hugging Face weights folders (sharded safetensors or ``pytorch_model-*.bin`` with their index)."""
