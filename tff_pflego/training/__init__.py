"""The training loop around an algorithm: sampling, client store, evaluation, logs."""
