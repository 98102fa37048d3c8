"""Pretrained models: a folder in the Hugging Face layout in, a torchformer model out, and back.

* :func:`~torchformer.pretrained.huggingface.from_huggingface` reads a folder that ``save_pretrained`` wrote (or
  ``huggingface-cli download gpt2 --local-dir gpt2`` fetched): ``config.json`` says the family (``model_type``), the
  family's module maps its config onto a :class:`~torchformer.config.TransformerConfig` and its tensors onto the model's
  parameters.
* :func:`~torchformer.pretrained.huggingface.to_huggingface` writes a torchformer model as such a folder,
  ``config.json`` and ``model.safetensors``, which ``transformers``' matching ``Auto`` class (``AutoModelForCausalLM``,
  ``AutoModelForMaskedLM``, ``AutoModelForSequenceClassification``, ``AutoModelForSeq2SeqLM``) loads into the equal
  model.
* :class:`~torchformer.pretrained.tokenizer.HuggingFaceTokenizer` runs a folder's ``tokenizer.json``.

The two functions live in :mod:`~torchformer.pretrained.huggingface`. One module per family:
:mod:`~torchformer.pretrained.gpt2` (``GPT2LMHeadModel`` <-> ``GTransformer``),
:mod:`~torchformer.pretrained.llama` (Llama, Mistral, Qwen2 ``...ForCausalLM`` <-> ``GTransformer``),
:mod:`~torchformer.pretrained.bert` (``BertForMaskedLM`` <-> ``MLMTransformer``, ``BertForSequenceClassification``
<-> ``CTransformer``), :mod:`~torchformer.pretrained.t5` (``T5ForConditionalGeneration`` <->
``Seq2SeqTransformer``), :mod:`~torchformer.pretrained.qwen3`, :mod:`~torchformer.pretrained.moe` (Mixtral,
Qwen3-MoE, OLMoE) and :mod:`~torchformer.pretrained.deepseek` (DeepSeek-V3), into the classes of
:mod:`torchformer.families`. The files are read by :mod:`~torchformer.pretrained.folders`, memory-mapped, one tensor at
a time, into a model :mod:`~torchformer.pretrained.building` made without initialising it. Nothing imports
``transformers``: the format is plain files (JSON and safetensors).

A config value the family's module cannot express is an error naming the field and the value, never a silently
different model: the loaded model computes the same log-probabilities as the original (within float32 rounding,
``1e-4``, as ``tests/test_huggingface_*.py`` check against ``transformers``).

    model = from_huggingface("gpt2")                    # a GTransformer, in eval() mode
    tokens = generate(model, prompt, 20, temperature=0)  # torchformer's KV cache
    to_huggingface(model, "gpt2-again")                 # config.json + model.safetensors

This package is part of the core: it needs only the config, the models and the file helpers, no training code.
"""

from torchformer.pretrained.huggingface import from_huggingface, to_huggingface
from torchformer.pretrained.tokenizer import HuggingFaceTokenizer

__all__ = ["HuggingFaceTokenizer", "from_huggingface", "to_huggingface"]
