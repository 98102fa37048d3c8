"""The transformer itself: attention, positions, blocks, stacks, output heads."""
