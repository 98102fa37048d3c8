"""A model folder in the Hugging Face layout: ``config.json`` and the weights, read one tensor at a time.

A folder that ``save_pretrained`` wrote (or ``huggingface-cli download`` fetched) holds ``config.json``, the
architecture as a JSON object whose ``model_type`` names the family (``"gpt2"``), and the weights in one of four
layouts, looked for in this order:

* ``model.safetensors``: one safetensors file;
* ``model.safetensors.index.json``: a sharded checkpoint, ``{"weight_map": {name: file}}`` naming the file of each
  tensor (``model-00001-of-00003.safetensors``, ...);
* ``pytorch_model.bin``: a pickled ``state_dict``, read with ``torch.load(weights_only=True)``, which builds only
  tensors and plain containers, never an object that could run code;
* ``pytorch_model.bin.index.json``: a sharded ``.bin`` checkpoint.

:class:`WeightReader` reads one tensor at a time, when it is asked for. A safetensors file is a JSON header (each
tensor's dtype, shape and byte range) and the tensors' bytes: the header is read once, and a tensor's bytes are read
from the file straight into the model's parameter when the two agree in dtype and layout
(:meth:`WeightReader.copy_into`), else into a tensor of their own that the caller converts and drops before the next. A
``.bin`` file is mapped by ``torch.load(mmap=True)``. So loading never holds two copies of the weights; from
safetensors, not even the pages of a mapped file (``benchmarks/load_pretrained.py`` measures the peak memory).

Nothing here imports ``transformers`` or ``safetensors``: the format is plain files (writing a folder uses
``safetensors``, ``pip install "torchformer[safetensors]"``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any, Optional, Union

import torch
from torch import Tensor

from torchformer._checks import non_finite
from torchformer._files import check_path, read_json, write_atomically

PathLike = Union[str, os.PathLike]

CONFIG_FILE = "config.json"
# The weight layouts, in the order they are looked for (the order transformers prefers them in).
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_LAYOUTS = (SAFETENSORS_FILE, SAFETENSORS_INDEX, BIN_FILE, BIN_INDEX)

# safetensors' names of the floating point dtypes (each tensor's entry in a file's header names one).
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_config(folder: PathLike) -> tuple[Path, dict[str, Any]]:
    """The folder as a path, and its ``config.json`` as a dict (with a ``model_type``).

    Args:
        folder: a model folder in the Hugging Face layout.

    Returns:
        ``(folder, config)``: the folder as a :class:`pathlib.Path`, and the JSON object of ``config.json``.

    Raises:
        TypeError: ``folder`` is not a path.
        FileNotFoundError: ``folder`` is not a folder, or holds no ``config.json``.
        ValueError: ``config.json`` is not a JSON object with a string ``model_type``.
    """
    folder = check_path(folder, "folder")
    if not folder.is_dir():
        hint = "" if folder.exists() else (f" (torchformer downloads nothing: with a network, huggingface-cli "
                                           f"download {folder.name} --local-dir {folder} fetches a model's folder)")
        raise FileNotFoundError(f"folder must be a model folder (config.json and the weights), got {folder}, which "
                                f"{'is a file' if folder.exists() else 'does not exist'}{hint}")
    file = folder / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{folder} holds no {CONFIG_FILE}; a model folder in the Hugging Face layout has "
                                f"{CONFIG_FILE} and one of {', '.join(WEIGHT_LAYOUTS)}")
    config = read_json(file)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{file} must be a JSON object with a \"model_type\" string (\"gpt2\", ...), as "
                         f"save_pretrained writes it")
    return folder, config


def weight_files(folder: Path) -> tuple[str, dict[str, Path]]:
    """Which layout ``folder`` holds its weights in, and the file of every tensor (for an index) or of all of them.

    Args:
        folder: the model folder.

    Returns:
        ``(layout, files)``: the layout's file name (one of :data:`WEIGHT_LAYOUTS`), and ``{tensor name: file}``
        for an index, ``{"": file}`` for a single file.

    Raises:
        FileNotFoundError: none of the four layouts is there, or an index names a missing file.
        ValueError: an index is not ``{"weight_map": {name: file name}}`` with plain file names in the folder.
    """
    for layout in WEIGHT_LAYOUTS:
        path = folder / layout
        if not path.is_file():
            continue
        if not layout.endswith(".index.json"):
            return layout, {"": path}
        index = read_json(path)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{path} must hold {{\"weight_map\": {{tensor name: file}}}}, got {weight_map!r:.80}")
        files = {}
        for name, file in weight_map.items():
            # A plain name in this folder: an index must not lead the reader elsewhere (../../secret).
            if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
                raise ValueError(f"{path} names the file {file!r} for {name}; expected a file name in {folder}")
            if not (folder / file).is_file():
                raise FileNotFoundError(f"{path} names {file} for {name}, which is not in {folder}")
            files[name] = folder / file
        return layout, files
    raise FileNotFoundError(f"{folder} holds no weights: none of {', '.join(WEIGHT_LAYOUTS)}")


class WeightReader:
    """The tensors of a model folder by name, memory-mapped, read one at a time: use it in a ``with`` block.

    The methods say what each reads (``dtype`` and ``shape`` only the header); the files are closed when the block
    ends.

    With ``check_finite``, each tensor read is checked for NaN and infinity, as the file stores it (before any
    conversion), and the names of those that hold any are kept in ``non_finite``, with their counts.

    Args:
        folder: the model folder (:func:`weight_files` finds the files).
        check_finite: check every tensor read.
    """

    def __init__(self, folder: PathLike, *, check_finite: bool = False) -> None:
        self.folder = check_path(folder, "folder")
        self.check_finite = check_finite
        self.non_finite: list[tuple[str, Tensor]] = []  # (name, its tensor as stored), for the message
        self.layout, self.files = weight_files(self.folder)
        self.where = self.folder / self.layout  # for the messages
        self._open: dict[Path, Any] = {}  # file -> an open _SafetensorsFile or _BinFile
        single = self.files.get("")  # a single file holds every tensor
        # tensor name -> its file
        self._file_of = dict(self.files) if single is None else dict.fromkeys(self._handle(single).keys(), single)

    def __enter__(self) -> WeightReader:
        return self

    def __exit__(self, kind: Optional[type], error: Optional[BaseException], trace: Optional[TracebackType]) -> None:
        self.close()

    def close(self) -> None:
        """Forget the open files (a ``.bin`` file's mapping goes with its last tensor); the tensors read stay valid."""
        self._open.clear()

    def _handle(self, file: Path) -> Any:
        """The open file, a :class:`_SafetensorsFile` or a :class:`_BinFile` (by its suffix): both read the same."""
        if file not in self._open:
            safetensors = file.suffix == ".safetensors"
            self._open[file] = _SafetensorsFile(file, self.where) if safetensors else _BinFile(load_bin(file))
        return self._open[file]

    def names(self) -> list[str]:
        """Every tensor's name, as the files store it (``transformer.h.0.ln_1.weight``, ...).

        Returns:
            The names, sorted.
        """
        return sorted(self._file_of)

    def _require(self, name: str) -> Path:
        if name not in self._file_of:
            raise KeyError(f"{self.where} holds no tensor {name!r}")
        return self._file_of[name]

    def tensor(self, name: str) -> Tensor:
        """Read one tensor.

        Args:
            name: its name in the files.

        Returns:
            The tensor, on the CPU, in the file's dtype.

        Raises:
            KeyError: no tensor has that name.
        """
        return self._checked(name, self._handle(self._require(name)).tensor(name))

    def _checked(self, name: str, tensor: Tensor) -> Tensor:
        if self.check_finite and non_finite([(name, tensor)]):
            self.non_finite.append((name, tensor))
        return tensor

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape, read from the header (the data stay on disk).

        Args:
            name: its name in the files.

        Returns:
            The shape, a tuple of ints.
        """
        return self._handle(self._require(name)).shape(name)

    def dtype(self, name: str) -> torch.dtype:
        """A tensor's dtype, read from the header (the data stay on disk).

        Args:
            name: its name in the files.

        Returns:
            The dtype.

        Raises:
            ValueError: a safetensors dtype that is not a float torchformer loads (``F32``, ``F16``, ...).
        """
        return self._handle(self._require(name)).dtype(name)

    def copy_into(self, name: str, target: Tensor) -> None:
        """Copy one tensor into ``target`` (a parameter of the stored shape), converting its dtype and device.

        From safetensors into a contiguous CPU ``target`` of the stored dtype, the bytes are read from the file
        straight into ``target``'s memory: no copy of the tensor is ever held besides the parameter itself.

        Args:
            name: its name in the files.
            target: where it goes, of the stored shape.
        """
        self._checked(name, self._handle(self._require(name)).copy_into(name, target))


class _SafetensorsFile:
    """A safetensors file: an 8-byte little-endian header length, a JSON header, then the tensors' bytes.

    The header (``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, offsets counted from the end of the
    header) is read once; a tensor's bytes are read with plain file reads when it is asked for. Plain reads, not a
    memory map: the operating system's cache of the file is then not this process's memory.
    """

    def __init__(self, file: Path, where: Path) -> None:
        self.file, self.where = file, where
        try:
            with open(file, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if not 0 < size <= file.stat().st_size - 8:
                    raise ValueError(f"a header of {size} bytes in a file of {file.stat().st_size}")
                header = json.loads(f.read(size))
        except (ValueError, UnicodeDecodeError) as e:  # json's errors are ValueErrors
            raise ValueError(f"{file} is not a readable safetensors file (damaged or truncated?): {e}") from e
        if not isinstance(header, dict):
            raise ValueError(f"{file} is not a readable safetensors file: its header is not a JSON object")
        header.pop("__metadata__", None)
        self.start, self.header = 8 + size, header

    def keys(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        code = self.header[name]["dtype"]
        if code not in SAFETENSORS_DTYPES:
            raise ValueError(f"{self.where}: {name} has dtype {code}; expected one of {', '.join(SAFETENSORS_DTYPES)}")
        return SAFETENSORS_DTYPES[code]

    def tensor(self, name: str) -> Tensor:
        out = torch.empty(self.shape(name), dtype=self.dtype(name))
        self._read(name, out)
        return out

    def copy_into(self, name: str, target: Tensor) -> Tensor:
        if target.device.type == "cpu" and target.dtype == self.dtype(name) and target.is_contiguous():
            self._read(name, target.detach())  # straight into the parameter's memory
            return target.detach()  # the stored values
        stored = self.tensor(name)
        target.copy_(stored)
        return stored

    def _read(self, name: str, out: Tensor) -> None:
        """Read ``name``'s bytes into ``out``'s memory (contiguous, CPU, of the stored dtype and shape)."""
        begin, end = self.header[name]["data_offsets"]
        raw = out.reshape(-1).view(torch.uint8)  # the same memory, as bytes (safetensors is little-endian, as torch)
        if end - begin != raw.numel():
            raise ValueError(f"{self.file}: {name} holds {end - begin} bytes, but its dtype and shape make "
                             f"{raw.numel()} (damaged?)")
        if raw.numel() == 0:
            return
        with open(self.file, "rb") as f:
            f.seek(self.start + begin)
            if f.readinto(memoryview(raw.numpy())) != raw.numel():
                raise ValueError(f"{self.file} ends inside {name} (truncated?)")


class _BinFile:
    """A ``pytorch_model.bin`` file's state_dict, its tensors views of the mapped file (:func:`load_bin`)."""

    def __init__(self, state: dict[str, Tensor]) -> None:
        self.state = state

    def keys(self) -> list[str]:
        return list(self.state)

    def tensor(self, name: str) -> Tensor:
        return self.state[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.state[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.state[name].dtype

    def copy_into(self, name: str, target: Tensor) -> Tensor:
        target.copy_(self.state[name])
        return self.state[name]


def load_bin(file: Path) -> dict[str, Tensor]:
    """A ``pytorch_model.bin`` file's tensors, memory-mapped, read with ``weights_only=True`` (no code runs).

    Args:
        file: the ``.bin`` file (a ``torch.save``'d state_dict).

    Returns:
        ``{name: tensor}``, CPU tensors backed by the mapped file.

    Raises:
        ValueError: the file cannot be read, or does not hold a dict of tensors.
    """
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):  # mmap needs the zip format of torch >= 1.6; an older file is read whole
            raise ValueError(f"{file} is not a readable PyTorch checkpoint: {e}") from e
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling error, a truncated file
        raise ValueError(f"{file} is not a readable PyTorch checkpoint: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"{file} must hold a state_dict, {{name: tensor}}, got {type(state).__name__}")
    return state


def copy_tensor(reader: WeightReader, stored: str, target: Tensor) -> None:
    """Copy the stored tensor ``stored`` into the parameter ``target``, after checking its shape.

    Args:
        reader: the folder's tensors.
        stored: the tensor's name in the files.
        target: the parameter it fills.

    Raises:
        ValueError: the stored shape is not the parameter's (the config's); the message names the tensor.
    """
    if reader.shape(stored) != tuple(target.shape):
        raise ValueError(f"{reader.where}: {stored} has shape {reader.shape(stored)}, but config.json makes it "
                         f"{tuple(target.shape)}")
    with torch.no_grad():
        reader.copy_into(stored, target)  # straight into the parameter where dtype and layout agree


def write_folder(folder: PathLike, config: dict[str, Any], tensors: dict[str, Tensor]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` into ``folder`` (created if needed), each atomically.

    Args:
        folder: the folder to write.
        config: the JSON object of ``config.json``.
        tensors: ``{name: tensor}``, each contiguous and stored in no other entry (safetensors stores no shared
            memory).

    Returns:
        The folder, as a :class:`pathlib.Path`.
    """
    folder = check_path(folder, "folder")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"folder must be a folder to write the model to, got the file {folder}")
    try:
        import safetensors.torch  # an optional dependency
    except ImportError as e:
        raise ImportError('writing model.safetensors needs the safetensors package: '
                          'pip install "torchformer[safetensors]"') from e
    folder.mkdir(parents=True, exist_ok=True)
    # metadata format=pt: transformers reads a file without it as another framework's.
    write_atomically(folder / SAFETENSORS_FILE,
                     lambda tmp: safetensors.torch.save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_atomically(folder / CONFIG_FILE,
                     lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8"))
    return folder
