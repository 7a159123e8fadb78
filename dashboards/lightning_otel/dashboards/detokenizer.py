"""Token id -> readable text for the dashboard's token view (POST /v1/detokenize), with the
policy's own tokenizer.json. Imports `tokenizers` only when one is made."""

from __future__ import annotations

import os
import threading
from pathlib import Path


class Detokenizer:
    """Token id -> the text it stands for, one id at a time, readable for byte-level BPE.

    Decoding ids one by one splits multi-byte characters; such a piece is shown as its bytes
    (`\\xe2\\x80`) instead of a replacement character, so no token looks empty or alike."""

    def __init__(self, model_dir: str | os.PathLike) -> None:
        from tokenizers import Tokenizer

        path = Path(model_dir)
        path = path if path.is_file() else path / "tokenizer.json"  # a model folder, or the file itself
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self._byte_of_char = _byte_level_alphabet()
        self._cache: dict[int, str] = {}
        self._lock = threading.Lock()

    def pieces(self, ids: list[int]) -> list[str]:
        with self._lock:  # the cache is shared by the server's threads
            for token_id in set(ids) - self._cache.keys():
                if 0 <= token_id < self._vocab_size:  # the cache never outgrows the vocabulary
                    self._cache[token_id] = self._piece(token_id)
            return [self._cache.get(token_id, f"<id {token_id}>") for token_id in ids]

    def _piece(self, token_id: int) -> str:
        raw = self._tokenizer.id_to_token(token_id)
        if raw is None:
            return f"<id {token_id}>"
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        if text and "\ufffd" not in text:
            return text
        if all(ch in self._byte_of_char for ch in raw):  # a byte-level piece that is not whole UTF-8
            return "".join(f"\\x{self._byte_of_char[ch]:02x}" for ch in raw)
        return raw


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, reversed (what byte-level BPE pieces are made of)."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars
