"""The projector: the journal folded into the SQL store, and the process that tails it.

``apply`` writes records to the store (:class:`Projector`), ``fold`` turns
records into run and step state, ``tail`` follows a journal by seq,
``process`` and ``link`` run and supervise the projector process.
"""

from tiffany.projector.apply import ApplyReport, Projector

__all__ = ["ApplyReport", "Projector"]
