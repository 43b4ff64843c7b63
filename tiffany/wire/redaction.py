"""Credentials in URLs, masked wherever text is shown: the one rule.

A URL can carry a credential two ways: in its userinfo
(``postgresql://user:password@host/db``, ``https://TOKEN@host/``) and in its
query (``?token=...``, ``&api_key=...``). :func:`redact_url_credentials`
masks both in any text, whatever else the text holds (an error message, a
log line, a traceback), and keeps the rest of the URL, so the message still
says which server it was about. Every place that shows text uses it: log
lines (:func:`tiffany.log.redact_text`), the settings as ``tiffany config``
prints them, the SDK's error messages and the CLI's standard error
(``tiffany/cli/__init__.py``).

Examples:
    >>> redact_url_credentials("cannot reach http://ann:s3cret@api:8000/x?token=abc&n=1")
    'cannot reach http://ann:[REDACTED]@api:8000/x?token=[REDACTED]&n=1'
    >>> redact_url_credentials("https://ghp_abc@github.com/o/r")
    'https://[REDACTED]@github.com/o/r'

Discussion: a user name alone (``https://TOKEN@host``) is masked too: a
token given as the user name is how several hosts take them, and the name
is not worth the risk. Rejected: parsing each URL with ``urllib`` (messages
are free text; a URL inside one has no known end).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["REDACTED", "SECRET_PARAM_WORDS", "redact_url_credentials"]

#: What replaces a secret.
REDACTED: Final = "[REDACTED]"
#: Query parameter names whose values are secrets (a regular expression).
SECRET_PARAM_WORDS: Final = r"(?:token|access_token|api[_-]?key|key|password|passwd|secret|auth)"

# scheme://user:password@ or scheme://user@ (up to the host: no "/", "@" or space before it)
_USERINFO: Final = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^\s/@:?#\\\"]*)(:[^\s/@?#\\\"]*)?@")
# ?token=... &api_key=... in URLs and query strings. Not a backslash: in a
# line already rendered as JSON the value ends at an escaped quote (\").
_QUERY: Final = re.compile(rf"([?&;]{SECRET_PARAM_WORDS}=)[^&;\s\"'#\\]+", re.IGNORECASE)


def _userinfo(match: re.Match[str]) -> str:
    scheme, user, password = match.group(1), match.group(2), match.group(3)
    if password is not None:
        return f"{scheme}{user}:{REDACTED}@"
    return f"{scheme}{REDACTED}@"


def redact_url_credentials(text: str) -> str:
    """``text`` with every URL's userinfo and secret query parameters masked."""
    # Substring tests first: most text has no URL, and a regex scan of a log
    # line costs microseconds on every line a server writes.
    if "@" in text and "://" in text:
        text = _USERINFO.sub(_userinfo, text)
    if "=" in text and ("?" in text or "&" in text or ";" in text):
        text = _QUERY.sub(rf"\1{REDACTED}", text)
    return text
