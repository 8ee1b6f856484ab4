"""PyTorch files (``torch.save``, zip and legacy layouts), read without torch and without running
any of the file's code."""
