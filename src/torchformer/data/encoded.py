"""A tokenized corpus kept on disk, so that a restarted run does not tokenize the same texts again.

Tokenizing the 68,693 reviews of the IMDb pretraining corpus takes a noticeable time at every start, resumes
included, and a slow CPU makes it minutes. :func:`cached_encoding` keeps the token ids in one ``.npz`` file whose
name holds a digest of what they depend on (:func:`encoding_key`: the texts in their order, the tokenizer's state,
the length limit), so a change to any of them is a new key and a new file, never a stale one (a new version of
the optional ``tokenizers`` package is not part of the key: delete the folder after upgrading it). The file is written
atomically and read without pickle; one that is damaged or holds another key is recomputed and replaced.

Shapes: a corpus is a list of ``n`` token-id lists of any lengths; on disk, their concatenation ``ids`` and their
``lengths`` ``(n,)``.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from torchformer._files import write_atomically

FORMAT = 1  # part of every key: a new layout of the file changes every key


def encoding_key(texts: Sequence[str], tokenizer_state: Mapping[str, Any], max_length: Optional[int]) -> str:
    """The SHA-256 digest of what a tokenized corpus depends on.

    Args:
        texts: the texts, in the order their ids are kept (another order is another key).
        tokenizer_state: the tokenizer's ``state_dict()`` (JSON-serialisable, as every torchformer tokenizer's).
        max_length: the length limit the texts are cut to; ``None``: none.

    Returns:
        64 hex digits.

    Raises:
        TypeError: ``texts`` is a single ``str``.
    """
    digest = hashlib.sha256(f"torchformer tokenized corpus {FORMAT}\n{max_length}\n".encode())
    digest.update(json.dumps(tokenizer_state, sort_keys=True).encode())
    if isinstance(texts, str):  # a lone string would be read as its characters, one "text" each
        raise TypeError("texts must be a sequence of str, got one str (wrap it in a list)")
    for text in texts:  # each text with its length first, so ["ab", "c"] and ["a", "bc"] differ
        data = text.encode("utf-8", errors="surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def cached_encoding(folder: Path | str, name: str, key: str,
                    encode: Callable[[], list[list[int]]]) -> tuple[list[list[int]], bool]:
    """``encode()``'s token ids, read from ``folder`` when a file of the same ``name`` and ``key`` is there.

    The file is ``folder/{name}-{key[:16]}.npz``, holding ``ids``, ``lengths`` and the whole ``key``. Writing one
    removes the other files of the same ``name``: one corpus, one file.

    Args:
        folder: where the files are (made if missing).
        name: what the corpus is (``"pretraining"``, ``"validation"``): ASCII letters, digits and ``_``.
        key: :func:`encoding_key` of what ``encode`` reads.
        encode: computes the ids when no valid file is found.

    Returns:
        ``(ids, read)``: the ids of each text, and whether they were read from a file (``False``: computed, and
        saved).

    Raises:
        ValueError: ``name`` is not a plain file-name part, or ``key`` is not 64 hex digits.
    """
    if not name or not name.replace("_", "").isalnum() or not name.isascii():
        raise ValueError(f"name must be ASCII letters, digits and '_', got {name!r}")
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"key must be a SHA-256 hex digest (64 hex digits, encoding_key), got {key!r}")
    folder = Path(folder)
    path = folder / f"{name}-{key[:16]}.npz"
    if (ids := _read(path, key)) is not None:
        return ids, True
    ids = encode()
    lengths = np.array([len(row) for row in ids], dtype=np.int64)
    flat = np.fromiter((i for row in ids for i in row), dtype=np.int64, count=int(lengths.sum()))
    if flat.size == 0 or (flat.min() >= -(2**31) and flat.max() < 2**31):
        flat = flat.astype(np.int32)  # half the file; token ids rarely need more
    folder.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would add .npz to a name without it
            np.savez(f, ids=flat, lengths=lengths, key=np.array(key))

    write_atomically(path, write)
    for other in folder.glob(f"{name}-*.npz"):  # the files of other keys are stale now ('-' is in no name)
        if other != path and re.fullmatch(rf"{name}-[0-9a-f]{{16}}\.npz", other.name):
            other.unlink(missing_ok=True)
    return ids, False


def _read(path: Path, key: str) -> Optional[list[list[int]]]:
    """The ids in ``path`` if it is an intact file of ``key``; ``None`` if it is missing, damaged or another key's."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # missing, not numpy's, cut short
        return None
    if not isinstance(data, np.lib.npyio.NpzFile):  # a lone .npy array under the name
        return None
    with data:
        try:
            if str(data["key"]) != key:
                return None
            flat, lengths = data["ids"], data["lengths"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # a field missing or damaged
            return None
    integers = flat.dtype.kind in "iu" and lengths.dtype.kind in "iu"
    if not integers or lengths.ndim != 1 or flat.ndim != 1 or (lengths < 0).any() or int(lengths.sum()) != flat.size:
        return None
    rows = np.split(flat, np.cumsum(lengths)[:-1]) if lengths.size else []
    return [row.tolist() for row in rows]
