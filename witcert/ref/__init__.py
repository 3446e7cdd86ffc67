"""Pure-torch reference implementation: the specification the kernels are tested against.

Never imports triton. Runs on CPU and GPU tensors alike.
"""
