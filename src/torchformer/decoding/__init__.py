"""Decoding: the loops that drive a model's caches: sampling, beam search and the compiled one-token step."""
