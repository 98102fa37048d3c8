"""The two entry points: a Hugging Face folder to a torchformer model, and back.

:func:`from_huggingface` reads a folder, :func:`to_huggingface` writes one, each through the family's module that
``config.json``'s ``model_type`` (or the model's class) picks. Every family module has the same functions
(``config_from_huggingface``, ``empty_model``, ``load_weights``, ``config_to_huggingface``, ``export_weights``) and
names the models it writes (``MODELS``), so nothing here knows a family's details. See :mod:`torchformer.pretrained`
for the whole picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import torch

from torchformer._checks import check_bool, check_finite_weights, non_finite_message
from torchformer._devices import resolve_named_device
from torchformer.models import TransformerModel
import torchformer.pretrained.bert as bert  # the modules themselves: FAMILIES names them
from torchformer.pretrained.deepseek import DEEPSEEK_V2, DEEPSEEK_V3
import torchformer.pretrained.gpt2 as gpt2
import torchformer.pretrained.llama as llama
from torchformer.pretrained.moe import MIXTRAL, OLMOE, QWEN3_MOE
import torchformer.pretrained.qwen3 as qwen3
import torchformer.pretrained.t5 as t5
from torchformer.pretrained.folders import PathLike, WeightReader, read_config, write_folder
from torchformer.saving import unwrap_model

# model_type -> the module that maps the family: config_from_huggingface, empty_model, load_weights, ...
FAMILIES: dict[str, Any] = {"gpt2": gpt2, "llama": llama, "mistral": llama, "qwen2": llama, "bert": bert, "t5": t5,
                             "qwen3": qwen3, "mixtral": MIXTRAL, "qwen3_moe": QWEN3_MOE, "olmoe": OLMOE,
                             "deepseek_v3": DEEPSEEK_V3, "deepseek_v2": DEEPSEEK_V2}
# The families a model can be written as, in order: the first whose MODELS has the model's class and whose
# describes(model) is true (a GTransformer with learned positions is GPT-2, one with rotary positions Llama). The
# variants come first: each is a GTransformer too.
EXPORTS = (qwen3, MIXTRAL, QWEN3_MOE, OLMOE, DEEPSEEK_V3, DEEPSEEK_V2, gpt2, llama, bert, t5)


def from_huggingface(folder: PathLike, *, dtype: Optional[torch.dtype] = None,
                     device: Union[str, torch.device, None] = None, check_finite: bool = True) -> TransformerModel:
    """The torchformer model equal to the one in ``folder`` (Hugging Face layout), in ``eval()`` mode.

    Loading never holds two full copies of the weights and leaves the global random generators as they were: the
    model is built without initialising it (:mod:`~torchformer.pretrained.building`), then filled one tensor at a
    time (:mod:`~torchformer.pretrained.folders`).

    Args:
        folder: a folder with ``config.json`` and the weights in a layout :mod:`~torchformer.pretrained.folders`
            reads (``model.safetensors``, ``pytorch_model.bin`` with ``weights_only=True``, either sharded).
        dtype: the floating dtype of the model's parameters; ``None``: the dtype of the stored token embedding.
        device: where the model's parameters go (``"cpu"``, ``"cuda:0"``, ``"auto"``); ``None``: the CPU.
        check_finite: refuse weights that hold NaN or infinity (one pass over them after loading); ``False``: load
            them as they are.

    Returns:
        The model: a :class:`~torchformer.models.GTransformer` for ``model_type`` ``"gpt2"``, ``"llama"``,
        ``"mistral"`` and ``"qwen2"``, an :class:`~torchformer.models.MLMTransformer` for ``"bert"``, a
        :class:`~torchformer.models.CTransformer` for a ``"bert"`` whose ``architectures`` say
        ``BertForSequenceClassification``, and a :class:`~torchformer.models.Seq2SeqTransformer` for ``"t5"``.

    Raises:
        TypeError: ``folder`` is not a path, or ``dtype`` not a floating ``torch.dtype``.
        FileNotFoundError: the folder, its ``config.json`` or its weights are missing.
        ValueError: ``model_type`` is not supported, a config field holds a value torchformer cannot express (the
            message names the field and the value), the tensors do not fit the config (naming the tensor), or,
            with ``check_finite``, a tensor holds NaN or infinity (naming it).
    """
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype (torch.float32, torch.bfloat16, ...) or None, got "
                        f"{dtype!r}")
    check_bool(check_finite, "check_finite")
    target = torch.device("cpu") if device is None else resolve_named_device(device, "device")
    folder, hf_config = read_config(folder)
    kind = hf_config["model_type"]
    if kind not in FAMILIES:
        raise ValueError(f"config.json: model_type={kind!r} is not supported; torchformer loads "
                         f"{', '.join(map(repr, FAMILIES))}")
    family = FAMILIES[kind]
    config = family.config_from_huggingface(hf_config)
    with WeightReader(folder, check_finite=check_finite) as reader:
        model = family.empty_model(config, reader, dtype=dtype, device=target)  # memory, no values, no RNG
        family.load_weights(model, reader)
        if reader.non_finite:  # named as the files name them, as stored
            raise ValueError(non_finite_message(reader.where, reader.non_finite, "The file is broken (did its "
                                                "training diverge?); pass check_finite=False to load it anyway"))
        if check_finite:  # finite in the files: not so after a conversion to dtype?
            check_finite_weights(model, reader.where, converted_to=dtype)
    return model.eval()


def to_huggingface(model: torch.nn.Module, folder: PathLike) -> Path:
    """Write ``model`` as a Hugging Face folder: ``config.json`` and ``model.safetensors``.

    ``transformers`` loads the folder with the matching ``Auto`` class into the equal model (each model's family:
    :mod:`torchformer.pretrained`; a GTransformer with rotary positions and RMSNorm is written as Llama, Mistral with
    a ``window``). The weights keep their dtype; the folder is created if needed, and each file is replaced atomically.

    Args:
        model: a model whose config maps onto its family: the family's ``config_to_huggingface`` names every field
            that does not (the lists: ``docs/pretrained.md``). Without ``qkv_bias`` the query, key and value biases
            are written as zeros (the same function), and a BERT without token types with one zero token-type
            vector. Compiled or wrapped models are unwrapped.
        folder: the folder to write.

    Returns:
        The folder, as a :class:`pathlib.Path`.

    Raises:
        TypeError: ``model`` is not a torchformer model, or ``folder`` is not a path.
        ValueError: the model is of a class no family writes, or a config field does not map onto its family (the
            message names every such field and its value).
        NotADirectoryError: ``folder`` is an existing file.
        ImportError: the ``safetensors`` package is missing.
    """
    target = unwrap_model(model)
    if not isinstance(target, TransformerModel):
        raise TypeError(f"model must be a torchformer model (a GTransformer, an MLMTransformer, a "
                        f"Seq2SeqTransformer), got {type(target).__name__}")
    if not any(isinstance(target, family.MODELS) for family in EXPORTS):
        writes = "; ".join(f"{', '.join(cls.__name__ for cls in family.MODELS)} maps onto "
                           f"{family.__name__.split('.')[-1]}" for family in EXPORTS)
        raise ValueError(f"to_huggingface: a {type(target).__name__} does not map onto a Hugging Face family yet; "
                         f"{writes}")
    family = next((family for family in EXPORTS if isinstance(target, family.MODELS) and family.describes(target)),
                  None)
    if family is None:
        raise ValueError(f"to_huggingface: this {type(target).__name__} maps onto no Hugging Face family: GPT-2 has "
                         f"learned positions and Llama rotary positions with RMSNorm; it has positions="
                         f"{target.config.positions!r}, norm={target.config.norm!r}")
    return write_folder(folder, family.config_to_huggingface(target), family.export_weights(target))
