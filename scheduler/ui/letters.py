"""The names the status page gives dead letters (`LetterNames`).

On the topic a letter is named by its place, `partition:offset`, as `scheduler dlq`
names it. One topic holds every tenant's letters, so a place shown to a tenant's login
would tell it that other tenants' letters exist, how many, and which died before or
after its own. The page names a letter instead by an HMAC of its place under a key made
when the page starts: a name says nothing of any other letter and cannot be turned back
into a place without the key, and the page finds a letter by its name again by naming
the letters waiting (it reads the whole topic for the list anyway). A restart, which
logs everyone out too, renames every letter.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

from scheduler.worker.dead_letters import DeadLetter

NAME_CHARS = 16
"""64 bits: no two of the letters one topic keeps share a name but by a chance too small
to count, and a name cannot be guessed."""


class LetterNames:
    def __init__(self, key: bytes | None = None) -> None:
        self._key = secrets.token_bytes(32) if key is None else key

    def name(self, letter: DeadLetter) -> str:
        return hmac.new(self._key, letter.letter.encode(), hashlib.sha256).hexdigest()[:NAME_CHARS]

    def find(self, letters: Iterable[DeadLetter], name: str) -> DeadLetter | None:
        """The letter of `letters` named `name`, None if none is. Give it only the letters
        the asker may see: another's letter is then not found, whatever its name."""
        return next((letter for letter in letters if self.name(letter) == name), None)
