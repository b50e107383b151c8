"""age encryption of exported checkpoint files (``save_weights_external`` with
``age_encryption_recipients``), through the `pyrage` bindings of the age reference format.

Each file ``f`` becomes ``f.age`` encrypted to every recipient; the plaintext is removed. Done
while the checkpoint is still pending, so no reader ever sees a half-encrypted directory.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from loraplex.errors import user_error

AGE_SUFFIX = ".age"


def parse_recipients(recipients: Sequence[str], field: str = "age_encryption_recipients"
                     ) -> list[Any]:
    """Parse native ``age1…`` keys and SSH public keys.

    Raises:
        UserError: naming the index of a recipient pyrage cannot parse.
    """
    import pyrage  # lazy: only exports with encryption need it

    parsed: list[Any] = []
    for i, text in enumerate(recipients):
        try:
            if text.startswith("age1"):
                parsed.append(pyrage.x25519.Recipient.from_str(text))
            elif text.startswith(("ssh-", "ecdsa-")):
                parsed.append(pyrage.ssh.Recipient.from_str(text))
            else:
                raise ValueError("expected an 'age1…' key or an SSH public key")
        except Exception as exc:  # pyrage raises its own RecipientError / ValueError types
            raise user_error(f"{field}[{i}]", f"not an age recipient: {exc}") from exc
    if not parsed:
        raise user_error(field, "empty recipient list; omit the field for plain files")
    return parsed


def encrypt_directory(directory: str, recipients: Sequence[str]) -> list[str]:
    """Replace every file under ``directory`` by its age ciphertext; returns the new names."""
    import pyrage

    keys = parse_recipients(recipients)
    written = []
    for base, _, files in os.walk(directory):
        for name in files:
            plain = os.path.join(base, name)
            with open(plain, "rb") as f:
                ciphertext = pyrage.encrypt(f.read(), keys)
            with open(plain + AGE_SUFFIX, "wb") as f:
                f.write(ciphertext)
            os.remove(plain)
            written.append(os.path.relpath(plain + AGE_SUFFIX, directory))
    return sorted(written)
