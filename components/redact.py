"""Secrets out of text: what a secret's name looks like, and URLs with their passwords and tokens masked.

The bottom layer (no project imports): errors, the HTTP clients and MLflow tracking all use it, so a URL such as
`http://bob:pw@host/v1?token=abc` reaches messages, logs and MLflow params only as `http://***@host/v1?token=***`.
"""
from __future__ import annotations

import re

REDACTED = "***"
SECRET_WORDS = frozenset({"key", "apikey", "secret", "token", "password", "passwd", "credential", "credentials"})
# query parameters also carry signatures (signed S3/GCS/Azure URLs: X-Amz-Signature, sig) and bare auth values
SECRET_QUERY_WORDS = SECRET_WORDS | {"sig", "signature", "auth"}

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>`]+")
_TRAILING = ".,;:!?)]}"  # punctuation after a URL in prose belongs to the sentence
_USERINFO = re.compile(r"^([^:/?#]+://)[^/?#]*@")  # up to the last '@' of the authority
_PARAM = re.compile(r"([?&;#])([^=&;#]+)=([^&;#]*)")


def words(name: str) -> list[str]:
    """The words of a name: `openaiApiKey.value` -> [openai, api, key, value]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """Whether a param, tag or variable name names a secret (api_key, hf_token, aws_secret_access_key, ...).

    Matched on whole words so that `max_new_tokens` or `tokenizer` stay visible.
    """
    return any(word in SECRET_WORDS for word in words(key))


def _redact_param(match: re.Match) -> str:
    separator, name, value = match.groups()
    secret = value and any(word in SECRET_QUERY_WORDS for word in words(name))
    return f"{separator}{name}={REDACTED}" if secret else match.group(0)


def _redact_one(url: str) -> str:
    core = url.rstrip(_TRAILING)
    tail = url[len(core):]
    core = _USERINFO.sub(rf"\1{REDACTED}@", core)
    start = min((i for i in (core.find("?"), core.find("#")) if i >= 0), default=len(core))
    return core[:start] + _PARAM.sub(_redact_param, core[start:]) + tail


def redact_url(text: str) -> str:
    """`text` with every URL's user:password and token-like query values (token, api_key, key, access_token,
    password, secret, sig, signature, ...) replaced by `***`; everything else, URLs without secrets included,
    unchanged."""
    return _URL.sub(lambda match: _redact_one(match.group(0)), text)
