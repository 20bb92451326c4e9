"""The one redaction function family: what a secret looks like, and how it is removed.

Applied at the edge (every fact a Sources object returns goes through `redact_data`) and again by every
renderer, so no output path can print a secret it read. Every pattern is linear in its input: each can
only start where a run of its characters starts (a look-behind for "not preceded by one of us"), so
the engine never rescans a long run from each of its positions (the quadratic blow-up a 40k-character
value used to cost 13 s). `REDACT_INPUT_LIMIT` bounds the text scanned at all.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

REDACTED = "<redacted>"
# Longer text is cut before matching (a whole report with raw probe outputs stays far below it): a bound
# on the input is a bound on the work whatever the patterns.
REDACT_INPUT_LIMIT = 64 * 1024 * 1024

# Variable names whose values are secret (matched anywhere in the name, as before), plus short words
# that only count as whole segments (`DB_PASS`, `MY_PWD`, but not `PWD`, `OLDPWD` or `BYPASS`).
# The words are named once here: the pattern and `describe_redaction` (report headers) are built from them.
SECRET_NAME_WORDS = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "COOKIE", "SESSION", "WEBHOOK",
    "SIGNATURE", "JWT",
)  # fmt: skip
SECRET_NAME_SEGMENTS = ("PASS", "PWD", "PW", "SIG")
SECRET_NAME = re.compile(
    "|".join(SECRET_NAME_WORDS)
    + r"|_(?:" + "|".join(SECRET_NAME_SEGMENTS) + r")(?![A-Za-z0-9])|^(?:PASS|PW)_",
    re.I,
)  # fmt: skip
# scheme://user:password@host. The password may itself contain "@": the credentials run to the last
# "@" before the host. The scheme starts where a run of scheme characters starts.
URL_CREDENTIALS = re.compile(
    r"(?<![a-zA-Z0-9+.-])(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)(?P<cred>[^/@\s:]{1,256}(?::[^/\s]{0,256})?|:[^/\s]{1,256})@"
)
# Query parameters of presigned / signed URLs (S3, GCS, Azure SAS, generic tokens).
_URL_SECRET_PARAM = re.compile(
    r"(?<=[?&])(?P<name>X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|X-Goog-Signature"
    r"|X-Goog-Credential|Signature|sig|AWSAccessKeyId|access_token|token|api_key|apikey|key)"
    r"=(?P<value>[^&\s\"'#]+)",
    re.IGNORECASE,
)

# In free text (logs from another machine, command output) secrets show up as assignments to a
# secret-named variable or option (`HF_TOKEN=hf_...`, `"password": "..."`, `--api-key=...`,
# `--password X`) or as tokens whose format gives them away. Names are matched by whole segments, so
# NCCL_IB_PKEY or AUTHOR stay.
_SECRET_SEGMENT = (
    r"(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|PASS|PWD|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY"
    r"|SECRET[_-]?KEY|AUTH[_-]?KEY|AUTH[_-]?TOKEN|CREDENTIALS?|COOKIE|SESSION[_-]?KEY|WEBHOOK(?:[_-]?URL)?|JWT)"
)
# Options whose next word is a secret on a command line (`--auth X`, `--key X`, `--jwt X`) besides the
# secret segments: short words that as an option name a credential, and `-p` (mysql, redis-cli, sshpass).
_SECRET_OPTION_SEGMENT = r"(?:" + _SECRET_SEGMENT + r"|AUTH|KEY|PW|APIKEY)"
_NAME_CHARS = r"A-Za-z0-9_.-"
_SECRET_ASSIGNMENT = re.compile(
    # The name starts only where a run of name characters starts (linear), ends in a secret segment.
    rf"(?<![{_NAME_CHARS}])(?P<name>[{_NAME_CHARS}]{{0,128}}?(?<![A-Za-z0-9])"
    + _SECRET_SEGMENT
    + r"(?![A-Za-z0-9]))"
    r"(?P<sep>[\"']?[ \t]{0,8}[=:][ \t]{0,8}[\"']?)(?P<value>[^\s\"',;&]+)",
    re.IGNORECASE,
)
# `--password X`, `-password X`, `--auth X`, `--key=X`, `-p X` in a command line: the value is the next word.
_SECRET_OPTION_WORD = re.compile(
    r"(?<![^\s])(?P<name>(?:--?[A-Za-z0-9_-]{0,64}?(?<![A-Za-z0-9])"
    + _SECRET_OPTION_SEGMENT
    + r"|-p)(?![A-Za-z0-9_-]))(?P<sep>[ \t]{1,8}|=)(?P<value>[^\s-]\S*)",
    re.IGNORECASE,
)
# The same option names as whole words: an argv kept as a list (`["--auth", "X"]`) has the value in the
# next element, which no pattern over one string can see.
_SECRET_OPTION_NAME = re.compile(
    r"(?:--?[A-Za-z0-9_-]{0,64}?(?<![A-Za-z0-9])" + _SECRET_OPTION_SEGMENT + r"|-p)", re.IGNORECASE
)
# What _TOKEN_FORMATS, _BEARER and _WEBHOOK_URL recognise, in words (for describe_redaction).
TOKEN_FORMAT_NAMES = (
    "Hugging Face",
    "GitHub",
    "GitLab",
    "OpenAI-style",
    "AWS access key",
    "Slack",
    "Bearer/Basic",
    "JWT",
    "Google API/OAuth",
    "Azure AccountKey/SharedAccessSignature",
    "PEM private keys",
    "W&B API key (40 hex after `key`/`login`)",
)
_TOKEN_FORMATS = re.compile(
    # After a "-" too (`host-ghp_...`): the prefixes are distinctive; only `sk-` needs a word start.
    r"(?<![A-Za-z0-9_])(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|gl(?:cbt|rt|dt|ptt|ft|imt|oas)-[A-Za-z0-9_-]{20,}|(?<!-)sk-[A-Za-z0-9_-]{20,}"
    r"|(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA|ASCA)[0-9A-Z]{12,}|xox[abprs]-[A-Za-z0-9-]{10,}|api_org_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{35}"
    r"|ya29\.[A-Za-z0-9_-]{20,})(?![A-Za-z0-9_-])"
)
# A JWT (CI_JOB_JWT, ID tokens, GitHub Actions OIDC): three base64url parts, the first two JSON objects.
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
# Azure storage / service bus connection strings: `...;AccountKey=...;` and SAS signatures.
_AZURE_KEY = re.compile(
    r"(?<![A-Za-z0-9])(?P<name>AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<value>[^;\s\"']+)",
    re.IGNORECASE,
)
# A PEM private key (a GCP service-account JSON carries one): the whole block, bounded.
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z ]{0,20}PRIVATE KEY-----[^-]{0,16384}(?:-----END [A-Z ]{0,20}PRIVATE KEY-----)?"
)
# A W&B API key is 40 hex digits (`local-` before it on a W&B server) with no prefix of its own: it is
# recognised by the word before it (`wandb login KEY`, `login with key KEY`, `api key: KEY`).
_KEYED_HEX = re.compile(
    r"(?P<head>(?<![A-Za-z0-9_])(?:key|login)[ \t]{0,4}[=:]?[ \t]{0,4})(?:local-)?[0-9a-fA-F]{40}(?![0-9A-Za-z])",
    re.IGNORECASE,
)
# user:password@host without a scheme (MASTER_ADDR='user:pw@host', a host:port value, an argv word):
# the user starts where a word starts, so the pattern stays linear.
_HOST_USERINFO = re.compile(r"(?<![^\s='\"(\[,;])[A-Za-z0-9._~%+!$&*-]{1,64}:[^\s@/'\"<>]{1,256}@(?=[A-Za-z0-9\[])")
_BEARER = re.compile(r"(?P<head>(?<![A-Za-z0-9_])(?:Bearer|Basic)[ \t]{1,8})[A-Za-z0-9._~+/=-]{8,}")
_WEBHOOK_URL = re.compile(r"(?<![A-Za-z0-9])https://hooks\.slack\.com/[^\s\"']+")


def describe_redaction() -> str:
    """What redaction removes, in one sentence built from the rules of this module (report headers
    quote it, so the list a user reads is the list applied); docs/inputs.md has the details."""
    names = ", ".join(f"`{w}`" for w in SECRET_NAME_WORDS)
    segments = ", ".join(f"`_{s}`" for s in SECRET_NAME_SEGMENTS)
    return (
        f"values of variables whose names contain {names} (or end in a segment {segments}), "
        "secret-named options (`--password <value>`, `--api-key=<value>`, `--auth <value>`, `--key <value>`, `-p <value>`), credentials in URLs "
        "and in `user:password@host` values, signed/presigned-URL "
        "parameters (`X-Amz-Signature`, `sig`, `token`, ...), Slack webhooks, and tokens in known formats "
        f"({', '.join(TOKEN_FORMAT_NAMES)}); see docs/inputs.md"
    )


# Flag-like values of secret-named variables (AUTH_MODE=none) are not secrets; replacing the word
# everywhere would only garble reports.
_NOT_SECRET_VALUES = frozenset(
    {"true", "false", "none", "null", "unset", "auto", "default", "enabled", "disabled"}
)
# A secret-named variable's value is also replaced wherever it appears verbatim in text, but only when
# it looks like a secret: at least this long, not a number or version (SESSION_TIMEOUT=1000), not a plain
# word (AUTH_METHOD=password). Replacing short or ordinary values everywhere garbles reports ("1000"
# in every byte count); assignments (NAME=value) and known token formats are redacted whatever the value.
_LITERAL_MIN_LENGTH = 8
_NUMBER_LIKE = re.compile(r"[0-9][0-9.:,_/+-]*[smhdkKMGiB%]{0,3}")
_PLAIN_WORD = re.compile(r"[A-Za-z][a-z]*|[A-Z]+")
# Whole names that end in a secret-looking segment but are not secrets (the working directory).
_NOT_SECRET_NAMES = frozenset({"PWD", "PASS"})
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")


def is_secret_name(name: str) -> bool:
    """Whether a variable named `name` holds a secret (its value is never shown)."""
    return bool(SECRET_NAME.search(name[:256]))


def looks_like_secret(value: str) -> bool:
    """Whether a secret-named variable's value is distinctive enough to replace wherever it appears."""
    if len(value) < _LITERAL_MIN_LENGTH or value.lower() in _NOT_SECRET_VALUES:
        return False
    return not (_NUMBER_LIKE.fullmatch(value) or _PLAIN_WORD.fullmatch(value))


def _redact_assignment(m: re.Match[str]) -> str:
    value = m.group("value")
    if value.lower() in _NOT_SECRET_VALUES or value == REDACTED or value.startswith("<"):
        return m.group(0)
    if m.group("name").strip("-\"'").upper() in _NOT_SECRET_NAMES:
        return m.group(0)
    return f"{m.group('name')}{m.group('sep')}{REDACTED}"


def _redact_url_credentials(text: str) -> str:
    return URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_value(name: str, value: str) -> str:
    """One environment value: all of it when the name is secret, else credentials in URLs."""
    if is_secret_name(name):
        return REDACTED
    return redact_text(value, {})


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment with secret-looking values replaced: safe to store or print."""
    return {k: redact_value(k, v) for k, v in env.items()}


def redact_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """Remove credentials in URLs and signed-URL parameters, values assigned to secret-named variables
    or options (`NAME=value`, `--name value`), tokens in a known format (Hugging Face, GitHub, GitLab,
    OpenAI-style, AWS access keys, Slack tokens and webhooks, Bearer), and the literal value of a
    secret-named variable in `env` (the current environment by default) wherever it appears, when it
    looks like a secret (`looks_like_secret`: not a short value, a number or a plain word)."""
    return _redact_text(text, _secret_literals(env))


def _redact_text(text: str, literals: _Literals) -> str:
    """redact_text with the literals already collected."""
    if len(text) > REDACT_INPUT_LIMIT:
        text = text[:REDACT_INPUT_LIMIT] + " [truncated]"
    text = _PEM_PRIVATE_KEY.sub(REDACTED, text)  # first: `"private_key": "-----BEGIN` is an assignment too
    text = _redact_url_credentials(text)
    text = _HOST_USERINFO.sub(f"{REDACTED}@", text)
    text = _URL_SECRET_PARAM.sub(lambda m: f"{m.group('name')}={REDACTED}", text)
    text = _WEBHOOK_URL.sub(REDACTED, text)
    text = _SECRET_ASSIGNMENT.sub(_redact_assignment, text)
    text = _SECRET_OPTION_WORD.sub(_redact_assignment, text)
    text = _AZURE_KEY.sub(lambda m: f"{m.group('name')}={REDACTED}", text)
    text = _TOKEN_FORMATS.sub(REDACTED, text)
    text = _JWT.sub(REDACTED, text)
    text = _KEYED_HEX.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m.group('head')}{REDACTED}", text)
    return literals.replace(text)


class _Literals:
    """The secret-named variables' values to replace wherever they appear, collected once per
    environment (not once per string: an environment of N variables redacted value by value would
    be N x N). Few values: str.replace, longest first. Many: one scan indexed by each value's first
    characters, so the cost follows the text's length, not the number of values."""

    _MANY = 64

    def __init__(self, values: list[str]) -> None:
        # Longest first: a secret that contains a shorter one must not be left half replaced.
        self.values = sorted(set(values), key=len, reverse=True)
        self.by_head: dict[str, list[str]] = {}
        if len(self.values) > self._MANY:
            for value in self.values:
                self.by_head.setdefault(value[:_LITERAL_MIN_LENGTH], []).append(value)

    def replace(self, text: str) -> str:
        if not self.by_head:
            for value in self.values:
                text = text.replace(value, REDACTED)
            return text
        out: list[str] = []
        last = i = 0
        end = len(text) - _LITERAL_MIN_LENGTH
        while i <= end:
            for value in self.by_head.get(text[i : i + _LITERAL_MIN_LENGTH], ()):
                if text.startswith(value, i):
                    out += (text[last:i], REDACTED)
                    i = last = i + len(value)
                    break
            else:
                i += 1
        out.append(text[last:])
        return "".join(out)


def _secret_literals(env: Mapping[str, str] | None) -> _Literals:
    source = env if env is not None else os.environ
    return _Literals([v for k, v in source.items() if is_secret_name(k) and looks_like_secret(v)])


def redact_data(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """A JSON-able value with every string redacted (redact_text), and string values under
    environment-variable-like keys with secret names (an environment dict) replaced.

    Recursive: what users hand us is depth-checked at the edge (files.MAX_NESTING) before it gets here."""
    return _redact_data(value, _secret_literals(env))


def _redact_data(value: Any, literals: _Literals) -> Any:
    if isinstance(value, str):
        return _redact_text(value, literals)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            secret_key = isinstance(k, str) and _ENV_NAME.fullmatch(k) and is_secret_name(k)
            out[k] = REDACTED if secret_key and isinstance(v, str) and v else _redact_data(v, literals)
        return out
    if isinstance(value, (list, tuple)):
        out_list = [_redact_data(v, literals) for v in value]
        for i in range(1, len(value)):
            # An argv as a list: `--auth`, `X` -> `--auth`, `<redacted>`.
            before, item = value[i - 1], value[i]
            if (isinstance(before, str) and isinstance(item, str) and len(before) <= 80
                    and _SECRET_OPTION_NAME.fullmatch(before) and item and not item.startswith(("-", "<"))):  # fmt: skip
                out_list[i] = REDACTED
        return out_list
    return value


# --- terminal controls -------------------------------------------------------------------------------
# Text from outside (a log line, a file name, a frame's file name, an environment value) may carry bytes
# a terminal obeys: ESC starts OSC (window title, clipboard 52, hyperlinks 8), CSI (clear the screen, move
# the cursor) and DCS sequences, U+009B is CSI in one code point, BEL rings, BS and CR overwrite what was
# printed. Each is replaced by a visible escape (`\x1b`, `\x9b`, `\u202e`), so the user still sees that the
# input held it. Kept: tab and newline. Also made visible: the Unicode bidirectional overrides and
# isolates, which reorder what the reader sees ("Trojan Source").
_INVISIBLE_CODES = (
    [c for c in range(0x20) if c not in (0x09, 0x0A)] + [0x7F] + list(range(0x80, 0xA0))
    + list(range(0x202A, 0x202F)) + list(range(0x2066, 0x206A))
)  # fmt: skip
_VISIBLE = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _INVISIBLE_CODES}


def neutralize_controls(text: str) -> str:
    """`text` with every control a terminal would act on shown as a visible escape (`\\x1b`): all C0
    controls but tab and newline, DEL, all C1 controls, bidi overrides. A CR before a newline is dropped
    (a CRLF line end is no trick). Linear: one translate."""
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return text.translate(_VISIBLE)


def has_controls(text: str) -> bool:
    """Whether neutralize_controls would change `text` (tests and the sweep use it)."""
    return any(ord(ch) in _VISIBLE for ch in text)


def clean_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """The output edge for one string from outside: secrets redacted (redact_text), then terminal
    controls made visible (neutralize_controls). Every human format and every error message takes
    outside text through it."""
    return neutralize_controls(redact_text(text, env))


def clean_data(value: Any, env: Mapping[str, str] | None = None) -> Any:
    """redact_data, then every string (keys included) with its terminal controls made visible: a JSON-able
    value about to be rendered for a human (text, markdown). JSON output needs no neutralising:
    json.dumps escapes every control (and, with ensure_ascii, every C1 code point)."""
    return _neutralize_data(redact_data(value, env))


def _neutralize_data(value: Any) -> Any:
    if isinstance(value, str):
        return neutralize_controls(value)
    if isinstance(value, Mapping):
        return {(neutralize_controls(k) if isinstance(k, str) else k): _neutralize_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_neutralize_data(v) for v in value]
    return value


def one_line(text: str) -> str:
    """neutralize_controls, with a newline shown as `\\n` too: for outside text (a file name) placed where
    one line of output is one record (`path:line:col: ...`, a heading, an evidence line). It can then never
    start an output line of its own, which a CI log would obey as a workflow command (`::error ...`)."""
    return neutralize_controls(text).replace("\n", "\\n")
