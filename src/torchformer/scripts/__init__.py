"""What the example scripts share and a library user does not need.

Flag checks, thread choice, presets, whether a model fits in memory (:mod:`~torchformer.scripts.cli`), and starting
a run as one process or many under ``torchrun`` (:mod:`~torchformer.scripts.launch`). Your own scripts may use them;
the model needs none of it."""
