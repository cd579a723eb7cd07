"""Left: what an object's parts hold in place of its host, its state and its nursery
once it left memory (``ObjectHost.close``).

The instance and its capabilities refer to one another, so they are freed by the cycle
collector, with all they still hold. Letting go of the host's side at close leaves that
cycle small (issue 26: an activation left ~65 objects to the collector, which took ~20%
of the CPU of creating an object), and a reference kept past the activation (a task of
another object holding a Lifecycle, say) gets this typed error rather than reaching an
object that is no longer resident.
"""

from __future__ import annotations

from typing import Any

from nursery_jobs._errors import StorageError


class Left:
    """Stands in for an object's host, state or nursery after it left memory: every use
    raises ``StorageError`` naming the object."""

    __slots__ = ("_label", "_what")

    def __init__(self, label: str, what: str) -> None:
        self._label = label
        self._what = what

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse()

    def __call__(self, *args: object, **kwargs: object) -> Any:
        self._refuse()

    def _refuse(self) -> None:
        raise StorageError(
            f"{self._label} has left memory: its {self._what} is gone with it (a reference"
            " to it, its context or its Lifecycle was kept past its activation)")

    def __repr__(self) -> str:
        return f"<{self._label}'s {self._what}, left memory>"
