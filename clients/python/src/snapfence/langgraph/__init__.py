"""LangGraph checkpointers on snapfence (``pip install "snapfence[langgraph]"``).

:class:`SnapfenceSaver` (blocking) and :class:`AsyncSnapfenceSaver` (asyncio) store a thread's
checkpoints and pending writes under the thread's lease key, and every write presents that lease
as its fence: a worker that was paused past its lease and superseded on the thread gets
:class:`~snapfence.StaleToken` from ``graph.invoke``, its checkpoint never becomes the latest,
and the refusal is in the audit log.
"""

from ._async import AsyncSnapfenceSaver, AsyncThreadHold
from ._layout import ThreadNotHeld
from ._sync import SnapfenceSaver, ThreadHold

__all__ = ["AsyncSnapfenceSaver", "AsyncThreadHold", "SnapfenceSaver", "ThreadHold", "ThreadNotHeld"]
