"""Mixtral, Qwen3-MoE and OLMoE in the Hugging Face layout: Llama's attention with mixtures of experts.

The three are Llama-shaped (:mod:`torchformer.pretrained.llama`) with a mixture of experts in every block
(:class:`~torchformer.nn.moe.MoEFeedForward`, softmax routing over ``num_experts``, ``num_experts_per_tok`` per
token), and differ in data:

* **Mixtral** (:class:`~torchformer.families.MoETransformer`): the ``k`` weights renormalised; the experts under
  ``block_sparse_moe`` as ``w1`` (gate), ``w3`` (up) and ``w2`` (down); a sliding window as Mistral's.
* **Qwen3-MoE** (:class:`~torchformer.families.Qwen3MoETransformer`): Qwen3's per-head q/k RMSNorm; renormalised when
  ``norm_topk_prob``; the experts' own size ``moe_intermediate_size``; under ``mlp`` as ``gate_proj``, ``up_proj``,
  ``down_proj``.
* **OLMoE** (:class:`~torchformer.families.OLMoETransformer`): RMSNorm over the whole query and key projections;
  renormalised when ``norm_topk_prob`` (off in the released models).

**Experts.** A file stores each expert's three matrices on their own, ``(h, e)``, ``(h, e)`` and ``(e, h)``
(``experts.{j}.gate_proj.weight``, ...); torchformer stacks them, transposed, as the experts' ``w1``, ``v`` ``(E, e,
h)`` and ``w2`` ``(E, h, e)``. Files in transformers' fused layout (``experts.gate_up_proj`` ``(E, 2h, e)``,
``experts.down_proj`` ``(E, e, h)``) load too. The router's ``gate.weight`` ``(E, e)`` is the router's weight; the
balance loss's weight is ``router_aux_loss_coef``.

Shapes: e embedding size, E experts, h an expert's hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from torchformer.config import TransformerConfig
from torchformer.families import MoETransformer, OLMoETransformer, Qwen3MoETransformer
from torchformer.models import GTransformer
from torchformer.nn.moe import MoEOptions
import torchformer.pretrained.building as building
import torchformer.pretrained.llama as llama
from torchformer.pretrained.folders import WeightReader

EXPERT_WEIGHTS = ("w1", "v", "w2")  # torchformer's: gate, up (the value gated), down


@dataclass(frozen=True)
class MoEFamily:
    """One Hugging Face family of mixtures of experts: its names and its reading of ``config.json``.

    It has the functions every family module has (:mod:`torchformer.pretrained.huggingface`), as methods.

    Args:
        model_type: ``config.json``'s ``model_type``.
        architecture: the ``architectures`` entry it writes.
        model: the torchformer class it loads into and writes.
        mlp: the block's name for the mixture (``"block_sparse_moe"``, ``"mlp"``).
        expert_names: each expert's gate, up and down matrices' names.
        defaults: the config defaults of fields left out.
        read: ``config.json`` (with defaults) and the refusal maker -> the family's own config fields, and the
            parts' options (a tuple).
        write: the model -> the family's own ``config.json`` fields.
    """

    model_type: str
    architecture: str
    model: type[GTransformer]
    mlp: str
    expert_names: tuple[str, str, str]
    defaults: dict[str, Any]
    read: Callable[[Callable[[str], Any], Callable[[str, str], ValueError]], tuple[dict, tuple]]
    write: Callable[[GTransformer], dict[str, Any]]

    @property
    def MODELS(self) -> tuple[type, ...]:  # noqa: N802 - the name every family module has
        """The classes this family writes."""
        return (self.model,)

    def describes(self, model: GTransformer) -> bool:
        """Whether ``model`` is this family's class (the config is checked by :meth:`config_to_huggingface`).

        Args:
            model: the model to write.

        Returns:
            Whether its class is this family's.
        """
        return type(model) is self.model

    def config_from_huggingface(self, hf: dict[str, Any]) -> TransformerConfig:
        """The config of this family's ``config.json``.

        Args:
            hf: the JSON object of ``config.json``.

        Returns:
            The config, with its :class:`~torchformer.nn.moe.MoEOptions`.

        Raises:
            ValueError: a field holds a value torchformer cannot express (named, with its value).
        """
        get = {**self.defaults, **hf}.get
        refuse = llama.refuser(get)
        fields, options = self.read(get, refuse)
        return llama.make_config(**{**llama.shared_fields(hf, self.defaults), **fields}, options=options)

    def config_to_huggingface(self, model: GTransformer) -> dict[str, Any]:
        """This family's ``config.json`` for ``model``.

        Args:
            model: a model of :attr:`model`'s class.

        Returns:
            The JSON object.

        Raises:
            ValueError: config fields or options do not map (each named).
        """
        return {"model_type": self.model_type, "architectures": [self.architecture],
                **llama.shared_config_json(model), **self.write(model)}

    def empty_model(self, config: TransformerConfig, reader: WeightReader, *, dtype: Optional[torch.dtype],
                    device: torch.device) -> GTransformer:
        """The model of ``config`` with memory but no values yet.

        Args:
            config: what :meth:`config_from_huggingface` made.
            reader: the folder's tensors.
            dtype: the parameters' dtype, or ``None``: the stored embedding's.
            device: where the parameters go.

        Returns:
            The model.
        """
        return building.empty_model(self.model, config, dtype=dtype or llama.stored_dtype(reader), device=device)

    def block_rules(self, config: TransformerConfig, i: int) -> tuple[tuple[str, str], ...]:
        """Block ``i``'s one-tensor pairs: attention, norms, and the router (the experts are stacked: not pairs).

        Args:
            config: the model's config.
            i: the block.

        Returns:
            (stored, torchformer) pairs, relative to the block.
        """
        return llama.attention_rules(config) + ((f"{self.mlp}.gate.weight", "ff.router.weight"),)

    def load_weights(self, model: GTransformer, reader: WeightReader) -> None:
        """Copy the tensors into ``model``: Llama's, the routers, and every expert's three matrices.

        Args:
            model: the model, its values unset.
            reader: the folder's tensors.

        Raises:
            ValueError: a tensor is missing, left over, or of another shape than the config says.
        """
        def experts(prefix: str, left: set[str]) -> None:
            for i, block in self.expert_blocks(model):
                copy_experts(reader, f"{prefix}layers.{i}.{self.mlp}.experts", self.expert_names, block.ff, left)
            self.skip(model, prefix, left)

        llama.copy_weights(model, reader, lambda prefix: llama.rules(model.config, prefix,
                                                                     block=lambda i: self.block_rules(model.config, i)),
                           more=experts)

    def expert_blocks(self, model: GTransformer) -> list[tuple[int, Any]]:
        """The blocks whose feed-forward network is a mixture, with their indices: every block here.

        Args:
            model: the model.

        Returns:
            ``[(i, block), ...]``.
        """
        return list(enumerate(model.blocks.blocks))

    def skip(self, model: GTransformer, prefix: str, left: set[str]) -> None:
        """Remove from ``left`` the stored tensors this family's files hold but torchformer does not load: none here.

        Args:
            model: the model.
            prefix: the stack's prefix in the files.
            left: the stored names not read yet.
        """

    def export_weights(self, model: GTransformer) -> dict[str, Tensor]:
        """``model``'s parameters under this family's names, each expert's matrices on their own.

        Args:
            model: a model :meth:`config_to_huggingface` accepts.

        Returns:
            ``{name: tensor}``, contiguous CPU tensors.
        """
        tensors = llama.export_pairs(model, llama.rules(model.config, block=lambda i: self.block_rules(model.config,
                                                                                                      i)))
        for i, block in self.expert_blocks(model):
            tensors.update(export_experts(block.ff, f"{llama.PREFIX}layers.{i}.{self.mlp}.experts", self.expert_names))
        return tensors


def copy_experts(reader: WeightReader, where: str, names: tuple[str, str, str], network: Any,
                 left: set[str]) -> None:
    """Copy the experts stored under ``where`` into the stacked weights of ``network``, removing them from ``left``.

    Each expert's own matrices (``{where}.{j}.{name}.weight``), or transformers' fused ones (``{where}.gate_up_proj``,
    ``{where}.down_proj``).

    Args:
        reader: the folder's tensors.
        where: the experts' stored prefix, ``model.layers.{i}.mlp.experts``.
        names: each expert's gate, up and down matrices' names.
        network: the block's :class:`~torchformer.nn.moe.MoEFeedForward`.
        left: the stored names not read yet.

    Raises:
        ValueError: an expert's matrix is missing or of another shape than the config says.
    """
    stacked = [getattr(network, name) for name in EXPERT_WEIGHTS]  # (E, e, h), (E, e, h), (E, h, e)
    experts, emb, hidden = stacked[0].shape
    with torch.no_grad():
        if f"{where}.gate_up_proj" in left:  # transformers' fused layout: (E, 2h, e) and (E, e, h)
            gate_up, down = reader.tensor(f"{where}.gate_up_proj"), reader.tensor(f"{where}.down_proj")
            _check_shape(reader, f"{where}.gate_up_proj", gate_up, (experts, 2 * hidden, emb))
            _check_shape(reader, f"{where}.down_proj", down, (experts, emb, hidden))
            stacked[0].copy_(gate_up[:, :hidden].transpose(1, 2))
            stacked[1].copy_(gate_up[:, hidden:].transpose(1, 2))
            stacked[2].copy_(down.transpose(1, 2))
            left.difference_update({f"{where}.gate_up_proj", f"{where}.down_proj"})
            return
        for j in range(experts):
            for name, target in zip(names, stacked):
                stored = f"{where}.{j}.{name}.weight"
                if stored not in left:
                    raise ValueError(f"{reader.where} holds no {stored}, which this config.json's model has "
                                     f"({experts} experts)")
                tensor = reader.tensor(stored)  # (h, e), or (e, h) for the down matrix: as nn.Linear stores it
                _check_shape(reader, stored, tensor, tuple(reversed(target.shape[1:])))
                target[j].copy_(tensor.T)
                left.discard(stored)


def _check_shape(reader: WeightReader, name: str, tensor: Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(f"{reader.where}: {name} has shape {tuple(tensor.shape)}, but config.json makes it "
                         f"{tuple(expected)}")


def export_experts(network: Any, where: str, names: tuple[str, str, str]) -> dict[str, Tensor]:
    """Each expert's matrices of ``network`` under ``{where}.{j}.{name}.weight``, as ``nn.Linear`` stores them.

    Args:
        network: a :class:`~torchformer.nn.moe.MoEFeedForward`.
        where: the experts' stored prefix.
        names: each expert's gate, up and down matrices' names.

    Returns:
        ``{name: tensor}``, contiguous CPU tensors.
    """
    stacked = [getattr(network, name).detach() for name in EXPERT_WEIGHTS]
    return {f"{where}.{j}.{name}.weight": weight[j].T.contiguous().cpu()
            for j in range(stacked[0].size(0)) for name, weight in zip(names, stacked)}


def _moe_options(get: Callable[[str], Any], refuse: Callable[[str, str], ValueError], *, experts: str,
                 hidden: Optional[str], normalize: Any) -> MoEOptions:
    """The experts' options every family reads alike."""
    try:
        return MoEOptions(experts=get(experts), top_k=get("num_experts_per_tok"),
                          expert_hidden=None if hidden is None else get(hidden), normalize=normalize,
                          balance_loss=get("router_aux_loss_coef") or 0.0)
    except (TypeError, ValueError) as e:
        raise ValueError(f"config.json: its experts' fields do not make a mixture: {e}") from e


def _unmapped(model: GTransformer, family: str, *checks: tuple[str, bool, str]) -> None:
    llama.refuse_unmapped(model, family, checks)


def _read_mixtral(get: Callable[[str], Any], refuse: Callable[[str, str], ValueError]) -> tuple[dict, tuple]:
    if get("router_jitter_noise"):
        raise refuse("router_jitter_noise", "torchformer's router adds no noise: 0.0")
    return ({"window": get("sliding_window")},
            (_moe_options(get, refuse, experts="num_local_experts", hidden=None, normalize=True),))


def _write_mixtral(model: GTransformer) -> dict[str, Any]:
    o, config = model.config.options_of(MoEOptions), model.config
    _unmapped(model, "Mixtral", ("qkv_bias", not config.qkv_bias, "Mixtral has no attention biases: False"),
              ("out_bias", not config.out_bias, "Mixtral has no attention biases: False"),
              ("kqnorm", not config.kqnorm, "Mixtral does not normalise queries and keys: False"),
              ("options", _plain_softmax(o, normalize=True), "Mixtral routes by softmax, renormalised, all experts "
                                                             "routed: MoEOptions(score='softmax', normalize=True)"))
    return {"num_local_experts": o.experts, "num_experts_per_tok": o.top_k, "router_aux_loss_coef": o.balance_loss,
            "router_jitter_noise": 0.0, "sliding_window": config.window, "intermediate_size": _expert_hidden(model)}


def _plain_softmax(o: MoEOptions, *, normalize: Optional[bool] = None) -> bool:
    """Whether the options route as the softmax families do (no groups, shared experts, bias, capacity, dense)."""
    return (o.score == "softmax" and (normalize is None or o.normalize == normalize) and o.routed_scaling == 1
            and o.groups == 1 and o.shared_experts == 0 and not o.selection_bias and o.capacity_factor is None
            and o.dense_layers == 0)


def _expert_hidden(model: GTransformer) -> int:
    return model.blocks.blocks[-1].ff.hidden


def _read_qwen3_moe(get: Callable[[str], Any], refuse: Callable[[str, str], ValueError]) -> tuple[dict, tuple]:
    if get("decoder_sparse_step") != 1:
        raise refuse("decoder_sparse_step", "torchformer's mixture is in every block: 1")
    if get("mlp_only_layers"):
        raise refuse("mlp_only_layers", "torchformer's dense blocks are the first ones only (dense_layers): []")
    biased = bool(get("attention_bias"))
    experts = "num_experts" if get("num_experts") is not None else "num_local_experts"
    return ({"kqnorm": True, "qkv_bias": biased, "out_bias": biased},
            (_moe_options(get, refuse, experts=experts, hidden="moe_intermediate_size",
                          normalize=bool(get("norm_topk_prob"))),))


def _write_qwen3_moe(model: GTransformer) -> dict[str, Any]:
    o, config = model.config.options_of(MoEOptions), model.config
    _unmapped(model, "Qwen3-MoE", ("out_bias", config.qkv_bias == config.out_bias,
                                   "Qwen3-MoE's attention_bias is on all four projections or none"),
              ("window", config.window is None, "Qwen3-MoE's sliding window is some layers' only: None"),
              ("options", _plain_softmax(o), "Qwen3-MoE routes by softmax, no groups, shared experts, bias, capacity "
                                             "or dense blocks"))
    return {"num_experts": o.experts, "num_experts_per_tok": o.top_k, "norm_topk_prob": o.normalize,
            "router_aux_loss_coef": o.balance_loss, "moe_intermediate_size": _expert_hidden(model),
            "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": config.qkv_bias,
            "use_sliding_window": False, "sliding_window": None}


def _read_olmoe(get: Callable[[str], Any], refuse: Callable[[str, str], ValueError]) -> tuple[dict, tuple]:
    if get("clip_qkv") is not None:
        raise refuse("clip_qkv", "torchformer does not clip queries, keys and values: None")
    biased = bool(get("attention_bias"))
    return ({"kqnorm": True, "qkv_bias": biased, "out_bias": biased},
            (_moe_options(get, refuse, experts="num_experts", hidden=None, normalize=bool(get("norm_topk_prob"))),))


def _write_olmoe(model: GTransformer) -> dict[str, Any]:
    o, config = model.config.options_of(MoEOptions), model.config
    _unmapped(model, "OLMoE", ("out_bias", config.qkv_bias == config.out_bias,
                               "OLMoE's attention_bias is on all four projections or none"),
              ("window", config.window is None, "OLMoE has no sliding window: None"),
              ("options", _plain_softmax(o), "OLMoE routes by softmax, no groups, shared experts, bias, capacity or "
                                             "dense blocks"))
    return {"num_experts": o.experts, "num_experts_per_tok": o.top_k, "norm_topk_prob": o.normalize,
            "router_aux_loss_coef": o.balance_loss, "clip_qkv": None, "attention_bias": config.qkv_bias,
            "intermediate_size": _expert_hidden(model)}


_SHARED_DEFAULTS = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
                    "router_aux_loss_coef": 0.001, "num_experts_per_tok": 2}
MIXTRAL = MoEFamily("mixtral", "MixtralForCausalLM", MoETransformer, "block_sparse_moe", ("w1", "w3", "w2"),
                    {**_SHARED_DEFAULTS, "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5,
                     "num_local_experts": 8, "sliding_window": None, "router_jitter_noise": 0.0},
                    _read_mixtral, _write_mixtral)
QWEN3_MOE = MoEFamily("qwen3_moe", "Qwen3MoeForCausalLM", Qwen3MoETransformer, "mlp",
                      ("gate_proj", "up_proj", "down_proj"),
                      {**_SHARED_DEFAULTS, "max_position_embeddings": 32768, "num_experts_per_tok": 8,
                       "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                       "attention_bias": False, "use_sliding_window": False},
                      _read_qwen3_moe, _write_qwen3_moe)
OLMOE = MoEFamily("olmoe", "OlmoeForCausalLM", OLMoETransformer, "mlp", ("gate_proj", "up_proj", "down_proj"),
                  {**_SHARED_DEFAULTS, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "num_experts": 64,
                   "num_experts_per_tok": 8, "norm_topk_prob": False, "router_aux_loss_coef": 0.01,
                   "clip_qkv": None, "attention_bias": False},
                  _read_olmoe, _write_olmoe)
