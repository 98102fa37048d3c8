"""The transformer's parts: attention, masks, positions, caches, norms, feed-forward networks, blocks, stacks, heads."""
