"""A model with memory but no values yet: what every family's loader fills, one tensor at a time.

Building a model the ordinary way draws random initial weights (time, and the global random generators move) only
to overwrite them. Instead the model is built on the meta device (shapes only: no memory, no random numbers), then
given empty memory of the right dtype on the right device. ``to_empty`` gives every parameter its own memory, so
parameters that were one object (a tied output layer and token embedding) are made one object again.

It leaves every buffer empty too, and a loader fills only what the files store: so no part of a model a loader
builds may keep a buffer outside its ``state_dict`` (``persistent=False``). Such constants are computed where they
are used (ALiBi's slopes, the rotary angles); :func:`empty_model` refuses a model that has one.
"""

from __future__ import annotations

import torch

from torchformer.config import TransformerConfig
from torchformer.models import TransformerModel


def empty_model(model_class: type[TransformerModel], config: TransformerConfig, *, dtype: torch.dtype,
                device: torch.device) -> TransformerModel:
    """``model_class(config=config)`` with uninitialised parameters of ``dtype`` on ``device``, ties kept.

    Args:
        model_class: the torchformer model class.
        config: its config.
        dtype: the parameters' floating dtype.
        device: where the parameters go.

    Returns:
        The model; its parameters' values are whatever the memory held, for a loader to overwrite.

    Raises:
        ValueError: the model keeps a buffer outside its ``state_dict``, which no file would fill.
    """
    with torch.device("meta"):
        model = model_class(config=config)
    unsaved = sorted(set(dict(model.named_buffers())) - set(model.state_dict()))
    if unsaved:
        raise ValueError(f"{model_class.__name__} keeps buffers outside its state_dict ({', '.join(unsaved)}): built "
                         f"empty, nothing would fill them; compute them where they are used instead")
    # Each parameter reached under a second name (remove_duplicate=False) is tied to the first name's.
    first: dict[int, str] = {}
    ties = []
    for name, param in model.named_parameters(remove_duplicate=False):
        source = first.setdefault(id(param), name)
        if source != name:
            ties.append((name, source))
    model = model.to(dtype).to_empty(device=device)
    for name, source in ties:
        owner, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(owner), attribute, model.get_parameter(source))
    return model
