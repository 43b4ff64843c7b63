"""The API's asyncio connections to PostgreSQL, now :mod:`tiffany.ports.pg`.

Kept as a name for ``api/db_requests.py`` until the commands port takes it
over; new code imports :mod:`tiffany.ports.pg`.
"""

from tiffany.ports.pg import AsyncPool, Listener, projected_mark

__all__ = ["AsyncPool", "Listener", "projected_mark"]
