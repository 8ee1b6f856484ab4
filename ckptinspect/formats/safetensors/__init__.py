"""``.safetensors`` files: header, values, checks, and the writer."""
