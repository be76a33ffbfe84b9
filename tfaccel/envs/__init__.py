"""Environments and the env pool. Numpy only: nothing here imports TensorFlow."""
