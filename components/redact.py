"""Secrets out of text: which names name a secret, which values look like one, and URLs with their passwords and
tokens masked.

The bottom layer (no project imports): errors, the HTTP clients and MLflow tracking all use it, so a URL such as
`http://bob:pw@host/v1?token=abc` reaches messages, logs and MLflow params only as `http://***@host/v1?token=***`.
A secret is recognised by its exact name (`api_key`, `hf_token`, never `chars_per_token`) or by its shape (`sk-...`,
`hf_...`, `ghp_...`, `AKIA...`, long random strings), never by a word somewhere in a name: numbers stay visible.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter

REDACTED = "***"
# names of secrets, matched as a whole name or as the whole `_`-separated end of one (`hf_token`, `openai_api_key`)
SECRET_NAMES = frozenset({
    "api_key", "apikey", "token", "access_token", "refresh_token", "auth_token", "bearer_token", "id_token",
    "session_token", "secret", "client_secret", "secret_key", "private_key", "password", "passwd", "passphrase",
    "access_key", "access_key_id", "secret_access_key", "authorization", "credential", "credentials", "cookie",
})
# words that make a URL query parameter secret (`?key=`, `?access_token=`): a query value is never a number to show
SECRET_WORDS = frozenset({"key", "apikey", "secret", "token", "password", "passwd", "credential", "credentials"})
# query parameters also carry signatures (signed S3/GCS/Azure URLs: X-Amz-Signature, sig) and bare auth values
SECRET_QUERY_WORDS = SECRET_WORDS | {"sig", "signature", "auth"}

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>`]+")
_TRAILING = ".,;:!?)]}"  # punctuation after a URL in prose belongs to the sentence
_USERINFO = re.compile(r"^([^:/?#]+://)[^/?#]*@")  # up to the last '@' of the authority
_PARAM = re.compile(r"([?&;#])([^=&;#]+)=([^&;#]*)")
# values shaped like a credential, wherever they sit
_SECRET_SHAPES = re.compile("|".join([
    r"\bsk-(?=[A-Za-z0-9_\-]*\d)[A-Za-z0-9_\-]{20,}",  # OpenAI / Anthropic (sk-..., sk-proj-..., sk-ant-...)
    r"\bhf_[A-Za-z0-9]{20,}",                           # Hugging Face
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",                    # GitHub tokens
    r"\bgithub_pat_[A-Za-z0-9_]{20,}",                  # GitHub fine-grained tokens
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",                   # AWS access key ids
    r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",                # Slack
    r"\bAIza[0-9A-Za-z_\-]{30,}",                       # Google API keys
    r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"(?<=Bearer )[A-Za-z0-9._~+/\-]{8,}=*",              # Authorization header values
]))
_RANDOM_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+=_\-])[A-Za-z0-9+=_\-]{32,}")
# a name ending in a secret's name that counts or measures (`chars_per_token`, `max_token`) names no secret
_MEASURE_WORDS = frozenset({"per", "max", "min", "num", "n"})


def words(name: str) -> list[str]:
    """The words of a name: `openaiApiKey.value` -> [openai, api, key, value]."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """Whether a param, tag or variable name names a secret (api_key, hf_token, aws_secret_access_key, ...).

    The last part of a dotted key (`teacher.api_key`, `endpoint.apiKey`, `OPENAI_API_KEY`) must be a secret's name
    (`SECRET_NAMES`) or end with one after `_`; never a word inside a name: `max_new_tokens`, `tokenizer`,
    `chars_per_token` and `api_key_env` (the name of a variable, not a secret) stay visible.
    """
    parts = [part for part in re.split(r"[./]", key) if part and not part.isdigit()]
    if not parts:
        return False
    name = words(parts[-1])
    for start in range(len(name)):
        if "_".join(name[start:]) in SECRET_NAMES:
            return start == 0 or name[start - 1] not in _MEASURE_WORDS
    return False


def _looks_random(candidate: str) -> bool:
    """A long run of letters and digits that reads like a generated key, not like a name, a hash or a version:
    upper and lower case mixed about evenly, digits, a 16+ character stretch without `_`/`-`, high entropy."""
    if max(len(piece) for piece in re.split(r"[_\-]", candidate)) < 16:
        return False  # words joined by separators: an identifier
    upper = sum(char.isupper() for char in candidate)
    lower = sum(char.islower() for char in candidate)
    if not (upper and lower and any(char.isdigit() for char in candidate)):
        return False  # hex digests, commit hashes, run ids, uuids
    if not 0.3 <= upper / (upper + lower) <= 0.7:
        return False  # CamelCase names
    counts = Counter(candidate)
    entropy = -sum(n / len(candidate) * math.log2(n / len(candidate)) for n in counts.values())
    return entropy >= 4.0


def redact_secrets(text: str) -> str:
    """`text` with values shaped like credentials replaced by `***`: provider keys and tokens (`sk-...`, `hf_...`,
    `ghp_...`, `AKIA...`, `xox...-`, `AIza...`), JWTs, `Bearer` values and long random-looking strings."""
    text = _SECRET_SHAPES.sub(REDACTED, text)
    return _RANDOM_CANDIDATE.sub(lambda m: REDACTED if _looks_random(m.group(0)) else m.group(0), text)


def redact_value(key: str, value: object) -> str:
    """A param or tag value as text, secrets masked: everything under a secret's name (`is_secret_key`), values
    shaped like a secret under any name, URL passwords and tokens. Numbers and booleans are never secrets."""
    if isinstance(value, (bool, int, float)) or value is None:
        return str(value)
    text = json.dumps(value) if isinstance(value, (list, dict, tuple)) else str(value)
    if text and is_secret_key(key):
        return REDACTED
    return redact_url(redact_secrets(text))


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
