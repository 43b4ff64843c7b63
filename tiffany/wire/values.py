"""Values from outside a run, as the journal packs them and a replay compares them.

Step results, ``Now()``, thread results, signal payloads, a task's result
or an error's arguments: the records of ``tiffany/wire/records.py`` carry them
in their ``value`` fields (OUTCOME, WAKE, TASK_EXIT, RUN_END), packed
here. This module is how such a value becomes msgpack
(:func:`pack_value`), how it comes back (:func:`ext_hook`,
:func:`unpack_value`), and what bytes a replay compares (:func:`canonical`,
:func:`legacy_canonical`). It is a leaf: it imports only the standard
library and msgspec, and knows no record type (records imports it, never
the other way).

Values are stored in full, with the types msgpack would merge kept apart
by extensions::

    code 1  tuple      msgpack array of its items, packed
    code 2  set        msgpack array of its items, packed, sorted
    code 3  frozenset  msgpack array of its items, packed, sorted
    code 4  stand-in   UTF-8 repr (cut to STAND_IN_CHARS) of a value that
                       does not encode; decodes to an Unencodable

Invariants:
    - The bytes are part of the journal format: a replay compares the value
      it computes with the journaled one byte for byte, across versions
      (the golden journals, ``tests/test_records.py``). A change to how a
      value packs is a format change; :func:`legacy_canonical` keeps the
      bytes of the one change made so far.
    - A value packs to the same bytes in every process. A set is journaled
      sorted, on its own or inside a dataclass or Struct (there as a list,
      as ``msgspec`` packs it), so that its bytes do not hang on the
      process's hash seed (``tests/durable/test_hash_seed.py``).
    - A value that does not encode is still journaled: the part that does
      not is kept as its stand-in, in place, and a value rebuilt around a
      stand-in packs as the original did.
    - :func:`pack_value` copies only what it changes: a list or dict with
      nothing to pack inside comes back as itself (the common step result
      costs one pass over its items, no copy).
    - Data never makes the text of a stand-in, or :func:`text_of`, raise or
      fail to encode: a ``repr`` or ``str`` that raises is named instead,
      and lone surrogates are escaped (:func:`journal_text`). Packing and
      encoding a value may still raise, but only one of
      :data:`ENCODE_ERRORS`, which every record writer catches
      (``durable/recorder.py``), and :func:`encodable` makes any value
      encodable.

Discussion: this was the second half of ``tiffany/wire/records.py``. The two
change for different reasons: a record's layout is the journal's own and
changes with a new trailing field; a value's packing follows what user code
returns (dataclasses, Structs, sets, objects that do not encode) and has
its own compatibility story (stand-ins, sorted sets, the legacy bytes).
The record decoders need only :func:`ext_hook` from here.

Rejected: an ``enc_hook`` on the encoder instead of :func:`pack_value`'s
walk. msgspec encodes tuples and sets itself, as arrays, and never asks the
hook about them: they would come back as lists.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import msgspec

__all__ = [
    "ENCODE_ERRORS",
    "STAND_IN_CHARS",
    "Unencodable",
    "canonical",
    "encodable",
    "ext_hook",
    "journal_text",
    "legacy_canonical",
    "pack_value",
    "stand_in",
    "stand_in_text",
    "text_of",
    "unpack_value",
]

_EXT_TUPLE: Final = 1
_EXT_SET: Final = 2
_EXT_FROZENSET: Final = 3
_EXT_UNENCODABLE: Final = 4

_encoder = msgspec.msgpack.Encoder()


def ext_hook(code: int, data: memoryview) -> Any:
    """Return the value a msgpack extension of :func:`pack_value` stands for.

    The ``ext_hook`` of every decoder of journaled values (the record
    decoders of ``tiffany/wire/records.py``): a tuple, a set or a frozenset with
    its items unpacked (:func:`unpack_value`), or the :class:`Unencodable` a
    stand-in was.

    Raises:
        ValueError: ``code`` is no extension of this module's.
    """
    if code == _EXT_TUPLE:
        return tuple(unpack_value(x) for x in _values.decode(data))
    if code == _EXT_SET:
        return {unpack_value(x) for x in _values.decode(data)}
    if code == _EXT_FROZENSET:
        return frozenset(unpack_value(x) for x in _values.decode(data))
    if code == _EXT_UNENCODABLE:
        return Unencodable(bytes(data).decode("utf-8", "replace"))
    raise ValueError(f"unknown msgpack extension {code}")


_values = msgspec.msgpack.Decoder(ext_hook=ext_hook)


class Unencodable:
    """Stands for a value the journal could not store (its repr is kept).

    Its own repr is the kept one, and it packs as the stand-in it came
    from (:func:`pack_value`): a value a replay rebuilds around it (a
    dataclass holding it, a task's result) packs as the original did, and
    a whole value's stand-in (journals before stand-ins were kept inside
    structures) is the repr of what the replay rebuilt.
    """

    __slots__ = ("repr",)

    def __init__(self, text: str) -> None:
        self.repr = text

    def __repr__(self) -> str:
        return self.repr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unencodable) and other.repr == self.repr

    def __hash__(self) -> int:
        return hash(self.repr)


_PLAIN = (str, int, float, bool, bytes, type(None))


def pack_value(value: Any) -> Any:
    """Return ``value`` in a form msgpack keeps exactly (tuples and sets as extensions).

    A list or dict with nothing to pack inside comes back as itself, not a
    copy: encode the result before the value can change. A part that does
    not encode is kept as its stand-in (:func:`stand_in`), in place: the
    rest of a dict, list or dataclass is kept as it is. A stand-in packs as
    itself, so a value rebuilt from the journal packs as the value it was
    rebuilt from (what a replay compares: ``durable/dispatch.py``: ``same``).
    Any other object (a dataclass, a Struct) packs as ``msgspec.to_builtins``
    makes it, with the sets inside it sorted (``_order_sets``).
    """
    cls = value.__class__
    if cls in _PLAIN:
        return value
    if cls is dict:
        out: Any = None  # a copy, made only when a value packs differently
        for k, v in value.items():
            if v.__class__ not in _PLAIN:
                p = pack_value(v)
                if p is not v:
                    if out is None:
                        out = dict(value)
                    out[k] = p
        return value if out is None else out
    if cls is list:
        if _all_plain(map(type, value)):  # nothing to pack: checked in C (long lists)
            return value
        out = None
        for i, v in enumerate(value):
            if v.__class__ not in _PLAIN:
                p = pack_value(v)
                if p is not v:
                    if out is None:
                        out = list(value)
                    out[i] = p
        return value if out is None else out
    if cls is tuple:
        return msgspec.msgpack.Ext(_EXT_TUPLE, _encoder.encode([pack_value(v) for v in value]))
    if cls is set or cls is frozenset:
        code = _EXT_SET if cls is set else _EXT_FROZENSET
        return _set_ext(code, [pack_value(v) for v in value])
    if cls is Unencodable:
        return stand_in(value)
    try:
        out = msgspec.to_builtins(value, builtin_types=_EXT, enc_hook=stand_in)
    except (TypeError, msgspec.EncodeError):  # e.g. a key that is no str, number or tuple
        return stand_in(value)
    _order_sets(value, out)
    return out


_EXT: Final = (msgspec.msgpack.Ext,)


def _order_sets(src: Any, out: Any) -> None:
    """Sort, in place, the lists ``msgspec.to_builtins`` made of the sets inside ``src``.

    ``out`` is what ``to_builtins`` made of ``src`` (a dataclass, a Struct,
    an attrs class...): its tuples stay tuples (msgpack arrays: lists once
    journaled), its dicts keep their order, and a set becomes a list in the
    set's iteration order, which hangs on the process's hash seed. Each such
    list is sorted as :func:`pack_value` sorts a set (by the repr of its
    items: :func:`_set_key`), after the sets inside its items. The walk
    follows ``src`` and ``out`` side by side: a dict's values in order, a
    list's or tuple's items, an object's fields by their encoded names;
    where the two do not match (a dict whose keys merged in ``out``, an
    enum's value) it stops, and ``out`` stays as ``to_builtins`` made it.

    Discussion: the order of a dict, the tuples and everything else are left
    as they are, because a replay compares its values with the journal's
    byte for byte; only the sets change (old layout: see docs/wal-format.md, compatibility).

    Rejected: ``to_builtins(order="deterministic")``, which sorts the sets in
    C but also every dict (by key): the journaled order of a dataclass's
    dicts would change. And a Python walk of the value instead of
    ``to_builtins``, which would have to copy msgspec's rules for every type
    (renamed and omitted fields, tags, enums).

    Cost: a container whose items are all plain is passed over in C
    (:data:`_all_plain`); a step's result of many strings adds about twice
    the cost of packing it, where the WAKE that brought it took more.
    """
    cls = src.__class__
    pairs: Any
    if isinstance(src, dict):
        if out.__class__ is not dict or len(out) != len(src) or _all_plain(map(type, src.values())):
            return
        pairs = zip(src.values(), out.values(), strict=True)
    elif isinstance(src, list | tuple):  # namedtuples too
        if not isinstance(out, list | tuple) or len(out) != len(src) or _all_plain(map(type, src)):
            return
        pairs = zip(src, out, strict=True)
    elif isinstance(src, set | frozenset):
        if out.__class__ is not list or len(out) != len(src):
            return
        if not _all_plain(map(type, src)):
            for s, o in zip(src, out, strict=True):
                if s.__class__ not in _PLAIN:
                    _order_sets(s, o)
        out.sort(key=repr if _all_plain(map(type, out)) else _set_key)
        return
    elif out.__class__ is dict and not isinstance(src, enum.Enum):  # fields by name
        if _all_plain(map(type, out.values())):
            return
        if isinstance(src, msgspec.Struct):
            attr = dict(zip(cls.__struct_encode_fields__, cls.__struct_fields__, strict=True))
            pairs = ((getattr(src, attr.get(k, ""), None), v) for k, v in out.items())
        else:
            pairs = ((getattr(src, k, None), v) for k, v in out.items())
    elif out.__class__ is list and isinstance(src, msgspec.Struct):  # array_like
        values = [getattr(src, f) for f in cls.__struct_fields__]
        tagged = cls.__struct_config__.tag is not None
        pairs = zip(values, out[1:] if tagged else out, strict=False)
    else:
        return
    for s, o in pairs:
        if s.__class__ not in _PLAIN:
            _order_sets(s, o)


#: ``_all_plain(map(type, items))``: no item holds anything (in C, for long lists).
_all_plain: Final = frozenset(_PLAIN).issuperset

#: How the repr of a msgpack extension began; an address followed.
_EXT_REPR: Final = "<msgspec.msgpack.Ext object at "


def _set_ext(code: int, items: list[Any]) -> msgspec.msgpack.Ext:
    """Return the extension of a set: its packed ``items``, sorted (:func:`_set_key`)."""
    items.sort(key=repr if _all_plain(map(type, items)) else _set_key)
    return msgspec.msgpack.Ext(code, _encoder.encode(items))


def _set_key(item: Any) -> str:
    """Return what a set's packed ``item`` sorts by: its repr, an extension's bytes.

    An extension (a tuple, a set, a stand-in) has a repr that names its
    address: a set of them was packed in the order of their addresses, and
    a replay, which packs the set it decoded again, seldom found the same.
    An extension sorts by its code and bytes, placed among the other items
    where its repr placed it (a set with one among plain items is journaled
    as before).
    """
    if item.__class__ is msgspec.msgpack.Ext:
        return f"{_EXT_REPR}{item.code:02x}{bytes(item.data).hex()}"
    return repr(item)


#: Characters of a value's repr its stand-in keeps.
STAND_IN_CHARS: Final = 2000


def stand_in_text(value: Any) -> str:
    """Return what the journal keeps of a value it cannot store: its repr, cut.

    (Of a stand-in, the text it kept.) Never raises: a ``repr`` that raises
    is named instead, and the text's lone surrogates (a ``__repr__`` may
    return any string) are escaped (:func:`journal_text`).
    """
    if value.__class__ is Unencodable:
        return value.repr
    try:
        text = repr(value)
    except Exception as exc:  # noqa: BLE001 - a hostile __repr__ (or one too deep): named
        text = f"<{type(value).__qualname__} object: repr() raised {type(exc).__name__}>"
    return journal_text(text[:STAND_IN_CHARS])


def stand_in(value: Any) -> msgspec.msgpack.Ext:
    """Return the journaled stand-in of ``value`` (decoded: an :class:`Unencodable`).

    For a value that does not encode, or whose record would be too large.
    A replay compares a recorded stand-in with :func:`stand_in_text` of the
    value it computed (``durable/dispatch.py``: ``same``).
    """
    return msgspec.msgpack.Ext(_EXT_UNENCODABLE, stand_in_text(value).encode())


#: What packing (:func:`pack_value`) and encoding a value can raise because of
#: what it holds, never because of a bug: a lone surrogate (``"x\ud800y"``, from
#: a JSON ``\ud800`` escape: ``UnicodeEncodeError``, a ``ValueError``), an
#: integer past 64 bits (``OverflowError``), a mapping key msgpack has no form
#: for (``TypeError``), a structure nested too deep or holding itself
#: (``RecursionError``).
ENCODE_ERRORS: Final = (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError)


def journal_text(text: str) -> str:
    r"""Return ``text`` as the journal keeps text: lone surrogates escaped (``\ud800``).

    For text a record must hold whatever it is (a task's or step's name, an
    error's message, a dispatch's argument): UTF-8 cannot encode a lone
    surrogate, so it is kept as its backslash escape. Other text comes back
    as itself.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def text_of(value: Any) -> str:
    """Return ``str(value)`` as the journal (or an observer) keeps text; never raises.

    A ``__str__`` that raises is named instead (:func:`stand_in_text` rules),
    lone surrogates are escaped (:func:`journal_text`).
    """
    if value.__class__ is not str:
        try:
            value = str(value)
        except Exception as exc:  # noqa: BLE001 - a hostile __str__: named
            return f"<{type(value).__qualname__} object: str() raised {type(exc).__name__}>"
    return journal_text(value)


def encodable(value: Any, leaf: Any = stand_in) -> Any:
    """Return ``value`` (packed, or plain data) in a form that always encodes.

    Its text with lone surrogates escaped (:func:`journal_text`), lists,
    tuples and dicts walked (a key that is no text, number, bool or None:
    its stand-in's text), and any other part that does not encode (an
    integer past 64 bits, an object) replaced by ``leaf(part)``: its
    stand-in (msgpack), or for JSON, :func:`stand_in_text`. A value nested
    deeper than the interpreter recurses is replaced whole. Never raises.

    For what must be recorded or shown whatever it holds (an error's
    arguments, a record's fallback, a feed event); a step's *result* is not
    made to fit this way: it fails its step (``journal.value``).
    """
    try:
        return _encodable(value, leaf)
    except RecursionError:
        return leaf(value)


_SCALARS: Final = (float, bool, bytes, type(None), msgspec.msgpack.Ext)
_INT_MIN: Final = -(2**63)
_INT_END: Final = 2**64


def _encodable(value: Any, leaf: Any) -> Any:
    cls = value.__class__
    if cls is str:
        return journal_text(value)
    if cls is int:
        return value if _INT_MIN <= value < _INT_END else leaf(value)
    if cls in _SCALARS:
        return value if cls is not msgspec.msgpack.Ext or leaf is stand_in else leaf(value)
    if cls is list or cls is tuple:
        return [_encodable(v, leaf) for v in value]
    if cls is dict:
        return {_encodable_key(k): _encodable(v, leaf) for k, v in value.items()}
    return leaf(value)


def _encodable_key(key: Any) -> Any:
    cls = key.__class__
    if cls is str:
        return journal_text(key)
    if cls is int:
        return key if _INT_MIN <= key < _INT_END else stand_in_text(key)
    if cls is float or cls is bool or key is None:
        return key
    return stand_in_text(key)


def unpack_value(value: Any) -> Any:
    """Invert :func:`pack_value`: a copy of ``value``'s lists and dicts, its extensions decoded.

    For a value decoded from the journal (its extensions were decoded
    already: this copies), and for one :func:`pack_value` made in this
    process and not encoded (a re-run's reused outputs, a signal's payload,
    on their way to the run that journals them packed): both come out the
    same, as the value that was packed.
    """
    cls = value.__class__
    if cls is list:
        return [unpack_value(v) for v in value]
    if cls is dict:
        return {k: unpack_value(v) for k, v in value.items()}
    if cls is msgspec.msgpack.Ext:
        return ext_hook(value.code, memoryview(value.data))
    return value


def canonical(value: Any) -> bytes:
    """Return the journaled bytes of ``value`` (for comparing values exactly)."""
    return _encoder.encode(pack_value(value))


def legacy_canonical(value: Any) -> bytes:
    """Return ``value`` packed with the sets inside objects unsorted (``durable/dispatch.py``).

    Old layout: see docs/wal-format.md, compatibility. The same as :func:`canonical`
    for a value without such a set.
    """
    return _encoder.encode(_legacy_pack(value))


def _legacy_pack(value: Any) -> Any:
    """:func:`pack_value` as it was before sets inside objects were sorted (see above)."""
    cls = value.__class__
    if cls in _PLAIN:
        return value
    if cls is dict:
        return {k: _legacy_pack(v) for k, v in value.items()}
    if cls is list:
        return [_legacy_pack(v) for v in value]
    if cls is tuple:
        return msgspec.msgpack.Ext(_EXT_TUPLE, _encoder.encode([_legacy_pack(v) for v in value]))
    if cls is set or cls is frozenset:
        code = _EXT_SET if cls is set else _EXT_FROZENSET
        return _set_ext(code, [_legacy_pack(v) for v in value])
    if cls is Unencodable:
        return stand_in(value)
    try:
        return msgspec.to_builtins(value, builtin_types=_EXT, enc_hook=stand_in)
    except (TypeError, msgspec.EncodeError):
        return stand_in(value)
