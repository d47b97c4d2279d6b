"""The in-flight byte budget: memory held outside the cache by work in progress.

The cache's budget (`TableCache.max_bytes`) bounds what stays resident. Work in progress holds
memory beside it: a table being computed (its output and temporaries exist before the cache takes
the table; charged by `TableCache.get`),
a response body built per request (row slices, formats of a table too large to keep), and a
cached table or prepared body that is still being sent when the cache evicts it (the send keeps
the buffer alive). `InFlightBudget` counts those bytes and refuses new work that would take them
past `max_bytes` (`Overloaded`, answered 503 with `Retry-After`), so the process holds at most
the cache budget plus this budget plus a fixed baseline, however many clients ask at once.

Charges are named: every send of the same cached buffer (many clients fetching one hot table)
shares one charge, taken by the first and released by the last, because they share its memory.
All calls happen on the event loop thread, so no locks are needed.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


class Overloaded(Exception):  # noqa: N818 - the condition, not a failure of the caller
    """Admitting `requested` more bytes would exceed the in-flight budget; retry later."""

    def __init__(self, requested: int, held: int, limit: int, retry_after: float) -> None:
        super().__init__(
            f"{held} bytes of tables and bodies are in flight; {requested} more would exceed the "
            f"in-flight budget of {limit} bytes: retry in {retry_after:g}s"
        )
        self.requested = requested
        self.held = held
        self.limit = limit
        self.retry_after = retry_after


@dataclass
class _Charge:
    nbytes: int
    holders: int


class Lease:
    """One holder's share of a charge; `release()` (idempotent) gives it back."""

    __slots__ = ("_budget", "_name", "_released")

    def __init__(self, budget: InFlightBudget, name: Hashable) -> None:
        self._budget = budget
        self._name = name
        self._released = False

    def release(self) -> None:
        """Give the share back; the charge's bytes return to the budget with its last holder."""
        if not self._released:
            self._released = True
            self._budget._drop(self._name)


class InFlightBudget:
    """Bytes held by computations and response bodies in progress, bounded by `max_bytes`.

    Args:
        max_bytes: the budget in bytes.
        retry_after: seconds suggested to a caller refused with `Overloaded`.
    """

    def __init__(self, max_bytes: int, retry_after: float = 1.0) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.retry_after = retry_after
        self.peak = 0
        self.refused = 0
        self._held = 0
        self._charges: dict[Hashable, _Charge] = {}

    @property
    def held(self) -> int:
        """Bytes charged now."""
        return self._held

    @property
    def holders(self) -> int:
        """Leases held now: a charge shared by several holders counts each of them."""
        return sum(charge.holders for charge in self._charges.values())

    def acquire(self, name: Hashable, nbytes: int) -> Lease:
        """A share of the charge `name` of `nbytes` bytes: joins it when held already (its
        memory is shared), else charges `nbytes` or raises `Overloaded` when they do not fit."""
        charge = self._charges.get(name)
        if charge is not None:
            charge.holders += 1
            return Lease(self, name)
        if self._held + nbytes > self.max_bytes:
            self.refused += 1
            raise Overloaded(nbytes, self._held, self.max_bytes, self.retry_after)
        self._charges[name] = _Charge(nbytes, 1)
        self._held += nbytes
        self.peak = max(self.peak, self._held)
        return Lease(self, name)

    def _drop(self, name: Hashable) -> None:
        charge = self._charges[name]
        charge.holders -= 1
        if charge.holders == 0:
            del self._charges[name]
            self._held -= charge.nbytes
