"""What every framework view of a Loader shares: its length and its resumable state."""

from __future__ import annotations

from typing import Any


class LoaderView:
    """A framework's view of a Loader: ``len`` and the ``state_dict`` protocol pass through."""

    loader: Any

    def __len__(self) -> int:
        """Batches per epoch: ``len(loader)``."""
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position (JSON-able); see ``Loader.state_dict``."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the loader from ``state_dict()``; see ``Loader.load_state_dict``."""
        self.loader.load_state_dict(state)
