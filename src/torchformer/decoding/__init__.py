"""Decoding: the KV cache, sampling, beam search and the compiled one-token step."""
