"""The transformer itself: attention and its KV cache, positions, blocks, stacks, output heads."""
