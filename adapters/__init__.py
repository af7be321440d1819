"""Integrations of tiercache with training frameworks (PyTorch datasets and checkpoints)."""
