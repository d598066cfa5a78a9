"""Secret redaction: known secret shapes and long random tokens become `[REDACTED:<kind>]`.

Every code string passes `redact()` (through privacy.clean_code) before it is written: known
secret shapes (cloud keys, tokens, private key blocks, JWTs, password assignments, URLs with
passwords) and long high-entropy tokens are replaced by a marker naming the kind. It is a safety
net with false negatives (a secret that looks like prose) and a few false positives (a long
random-looking identifier).

Speed: each shape carries cheap necessary conditions (a literal, a keyword, a run of N token
characters) checked once per text, so most text runs only a few regexes (see SecretPattern).
`_redact(text, gated=False)` is the ungated reference the tests compare `redact()` with.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SecretPattern:
    """One secret shape, and the cheap gates that let redact() skip it for most text.

    Gates are necessary conditions, checked before the regex runs: when one fails the regex
    cannot match, so skipping it changes nothing (tests/telemetry/test_privacy.py compares
    redact() with the ungated reference on every sample).
    """

    kind: str  # the name in the [REDACTED:<kind>] marker
    triggers: tuple[str, ...]  # lowercase substrings one of which every match contains; () = none
    regex: re.Pattern[str]  # redacts group "s" (or "u") if it has one, else the whole match
    literals: tuple[str, ...] = ()  # case-sensitive substrings one of which every match contains
    min_run: int = 0  # every match holds a run of this many [A-Za-z0-9_-] characters
    min_b64_run: int = 0  # ... or of this many [A-Za-z0-9+/_=-] characters


def _secret(
    kind: str,
    triggers: str,
    pattern: str,
    *,
    literals: str = "",
    min_run: int = 0,
    min_b64_run: int = 0,
) -> SecretPattern:
    return SecretPattern(
        kind,
        tuple(triggers.split()),
        re.compile(pattern),
        tuple(literals.split()),
        min_run,
        min_b64_run,
    )


# Order matters: specific shapes first, generic assignments last, then high entropy.
# Speed: a pattern that starts with a literal is found by SQLite-fast literal search, so the
# word boundary is checked after the literal (`glpat-(?<!\wglpat-)`) rather than before it;
# patterns that cannot start with a literal run only when one of their triggers is in the text.
# Most shapes also need a long run of token characters (`min_run`): redact() finds the longest
# runs of the text once (bytes.translate, no regex) and skips every shape longer than those.
_KEYWORDS = (
    "password passwd pwd secret token api_key apikey api-key access_key accesskey private_key "
    "client_secret auth credential"
)


def _word(literal: str) -> str:
    """`literal`, not preceded by a word character, in a form that keeps the fast search."""
    return f"{literal}(?<!\\w{literal})"


SECRET_PATTERNS: tuple[SecretPattern, ...] = (
    _secret(
        "private_key",
        "",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
        literals="-----BEGIN",
    ),
    _secret(
        "aws_access_key",
        "",
        r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)(?<![A-Za-z0-9_]....)[A-Z0-9]{16}\b",
        min_run=20,
    ),
    _secret(
        "aws_secret_key",
        "aws",
        r"(?i:aws_?secret_?(?:access_?)?key)[\"']?\s*[:=]\s*[\"']?(?P<s>[A-Za-z0-9/+=]{40})",
        min_b64_run=40,
    ),
    _secret(
        "github_token",
        "",
        r"gh(?<![A-Za-z0-9_]..)(?:[pousr]_[A-Za-z0-9]{36,255}|ithub_pat_[A-Za-z0-9_]{22,255})\b",
        literals="gh",
        min_run=33,
    ),
    _secret(
        "gitlab_token",
        "",
        _word("glpat-") + r"[A-Za-z0-9_\-]{20,}",
        literals="glpat-",
        min_run=26,
    ),
    _secret(
        "slack_token",
        "",
        _word("xox") + r"[abprse]-[A-Za-z0-9-]{10,}",
        literals="xox",
        min_run=15,
    ),
    _secret(
        "slack_webhook",
        "",
        r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+",
        literals="https://hooks.slack.com/services/",
    ),
    _secret(
        "anthropic_key",
        "",
        _word("sk-ant-") + r"[A-Za-z0-9_\-]{20,}",
        literals="sk-ant-",
        min_run=27,
    ),
    _secret(
        "openai_key",
        "",
        _word("sk-") + r"(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
        literals="sk-",
        min_run=23,
    ),
    _secret(
        "huggingface_token",
        "",
        _word("hf_") + r"[A-Za-z0-9]{30,}\b",
        literals="hf_",
        min_run=33,
    ),
    _secret(
        "google_api_key",
        "",
        _word("AIza") + r"[0-9A-Za-z_\-]{35}",
        literals="AIza",
        min_run=39,
    ),
    _secret(
        "stripe_key",
        "_live_ _test_",
        r"\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{20,}\b",
        literals="_live_ _test_",
        min_run=28,
    ),
    _secret("twilio_key", "", _word("SK") + r"[0-9a-f]{32}\b", literals="SK", min_run=34),
    _secret(
        "sendgrid_key",
        "",
        _word("SG.") + r"[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",
        literals="SG.",
        min_run=16,
    ),
    _secret("npm_token", "", _word("npm_") + r"[A-Za-z0-9]{36}\b", literals="npm_", min_run=40),
    _secret(
        "pypi_token", "", _word("pypi-") + r"[A-Za-z0-9_\-]{50,}", literals="pypi-", min_run=55
    ),
    _secret(
        "jwt",
        "",
        _word("eyJ") + r"[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        literals="eyJ",
        min_run=11,
    ),
    _secret("bearer_token", "bearer", r"(?i:\bbearer)\s+(?P<s>[A-Za-z0-9_\-.=+/]{20,})"),
    _secret("url_password", "", r"://[^\s:/@\"'<>]+:(?P<s>[^\s@/\"'<>]+)@", literals="://"),
    _secret(
        "password_assignment",
        _KEYWORDS,
        # keyword, rest of the name, optional closing quote, = : := =>, then a quoted value (4+
        # chars) or an unquoted one (6+ chars, not a call, not after Bearer/Basic)
        r"(?i:password|passwd|pwd|secret|token|api_?key|api-key|access_?key|private_?key|auth(?!or)"
        r"|credential)[\w.\-]*[\"']?[ \t]*(?::=|=>|[:=])[ \t]*"
        r"(?:(?P<q>[\"'`])(?P<s>[^\"'`\n]{4,})|(?!(?i:bearer|basic)\s)"
        r"(?P<u>[^\s,;\"'`()\[\]{}<>]{6,}+)(?!\())",
    ),
)
_HIGH_ENTROPY_MIN = 24  # chars of a high-entropy candidate
_HIGH_ENTROPY_CANDIDATE = re.compile(rf"[A-Za-z0-9+/_\-=]{{{_HIGH_ENTROPY_MIN},}}")
# Where the password_assignment keywords start, found in the lowercased text (one literal-ish
# scan) so that its case-insensitive regex is only tried at those places.
_KEYWORD_START = re.compile(
    r"password|passwd|pwd|secret|token|api_?key|api-key|access_?key|private_?key|auth|credential"
)
# bytes.translate tables: token characters -> b"a", everything else (non-ASCII too) -> b" ".
_RUN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_RUN_TABLE = bytes(ord("a") if b in _RUN_CHARS else ord(" ") for b in range(256))
_B64_TABLE = bytes(ord("a") if b in _RUN_CHARS + b"+/=" else ord(" ") for b in range(256))
# Assigned values that are not secrets: placeholders, redaction markers, environment lookups.
_PLACEHOLDER = re.compile(
    r"^(?:.*\[REDACTED:[a-z_]+\].*|\*+|x+|<[^>]*>|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|none|null|"
    r"true|false|os\.environ.*|os\.getenv.*|getenv.*|process\.env.*|changeme|"
    r"[a-z][a-z0-9+.\-]*://[^\s@]*)$",
    re.IGNORECASE,
)
# An unquoted value made of letters, '_' and '.' only is a code reference (`password = pw.value`).
_CODE_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z_]*(?:\.[A-Za-z_]+)*$")


def shannon_entropy(token: str) -> float:
    """Bits per character of `token`'s own character distribution."""
    counts: dict[str, int] = {}
    for ch in token:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(token)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _looks_random(token: str) -> bool:
    """A long token mixing upper, lower and digits with > 4.2 bits/char: a key, not a name.

    Hex digests (git SHAs) top out at 4 bits/char and identifiers_like_this repeat letters, so
    neither is redacted; base64/base62 keys of 24+ chars usually exceed 4.2.
    """
    if len(token) > 4096:  # a blob of base64 data, not a credential
        return False
    if not (any(c.isdigit() for c in token) and any(c.isupper() for c in token)):
        return False
    return any(c.islower() for c in token) and shannon_entropy(token) > 4.2


def _high_entropy(match: re.Match[str]) -> str:
    token = match.group(0)
    return "[REDACTED:high_entropy]" if _looks_random(token) else token


def _redactor(kind: str):
    marker = f"[REDACTED:{kind}]"

    def replace(match: re.Match[str]) -> str:
        groups = match.groupdict()
        name = "s" if groups.get("s") is not None else "u" if groups.get("u") is not None else None
        if name is None:
            return marker
        value = groups[name]
        if _PLACEHOLDER.match(value) or (name == "u" and _CODE_REFERENCE.match(value)):
            return match.group(0)
        start, end = match.start(name) - match.start(), match.end(name) - match.start()
        return match.group(0)[:start] + marker + match.group(0)[end:]

    return replace


_REPLACERS = {p.kind: _redactor(p.kind) for p in SECRET_PATTERNS}


_SECRET_NAME = re.compile(
    r"(?i:password|passwd|pwd|secret|token|api_?key|api-key|access_?key|private_?key|auth(?!or)"
    r"|credential)"
)


@functools.lru_cache(maxsize=4096)  # the same few keys come back in every tool call
def is_secret_name(name: str) -> bool:
    """Whether a field or JSON key names a secret (`{"password": ...}`, `DB_TOKEN`)."""
    return bool(_SECRET_NAME.search(name))


def named_secret(name: str, value: str) -> bool:
    """Whether `value`, stored under the key `name`, is a secret by its name alone
    (`{"password": "hunter2"}`): the name says so and the value is no placeholder."""
    return len(value) >= 4 and is_secret_name(name) and not _PLACEHOLDER.match(value)


# The run lengths that some gate asks about, shortest first, with the needle that proves one.
_RUN_LEVELS = tuple((n, b"a" * n) for n in sorted({p.min_run for p in SECRET_PATTERNS} - {0}))
_B64_LEVELS = tuple(
    (n, b"a" * n) for n in sorted({p.min_b64_run for p in SECRET_PATTERNS} | {_HIGH_ENTROPY_MIN})
)


def _level(runs: bytes, levels: tuple[tuple[int, bytes], ...]) -> int:
    """The longest of `levels` that `runs` holds a run of (0 for none): a few fast `in`s."""
    found = 0
    for n, needle in levels:
        if needle not in runs:
            break
        found = n
    return found


class _Gates:
    """What the gates of SECRET_PATTERNS need to know about one text, computed once."""

    __slots__ = ("b64", "low", "run", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.low = text.lower()
        # UTF-8 keeps ASCII characters and turns every other one into bytes >= 0x80, which the
        # tables map to spaces: runs of token characters are the same as in the text.
        data = text.encode("utf-8", "surrogatepass")
        self.run = _level(data.translate(_RUN_TABLE), _RUN_LEVELS)
        self.b64 = _level(data.translate(_B64_TABLE), _B64_LEVELS)

    def candidates(self) -> tuple[int, ...]:
        """Indices of the patterns whose run gates this text passes, in order."""
        return _candidates(self.run, self.b64)

    def has_literal(self, pattern: SecretPattern) -> bool:
        for literal in pattern.literals:  # plain loops: 2x faster than any(genexpr) here
            if literal in self.text:
                return True
        return not pattern.literals

    def has_trigger(self, pattern: SecretPattern) -> bool:
        for trigger in pattern.triggers:
            if trigger in self.low:
                return True
        return not pattern.triggers


@functools.lru_cache(maxsize=256)
def _candidates(run: int, b64: int) -> tuple[int, ...]:
    return tuple(
        i for i, p in enumerate(SECRET_PATTERNS) if p.min_run <= run and p.min_b64_run <= b64
    )


_ALL = tuple(range(len(SECRET_PATTERNS)))


def _sub_password_assignment(pattern: SecretPattern, text: str, low: str) -> str:
    """`pattern.regex.sub(...)`, trying the regex only where a keyword starts.

    Every match starts with a keyword, so matching at each keyword position in order (skipping
    those inside the previous match) finds exactly the matches sub() finds, without running a
    case-insensitive alternation at every character. Needs `low` aligned with `text` (ASCII).
    """
    regex, replace = pattern.regex, _REPLACERS[pattern.kind]
    out: list[str] = []
    last = 0
    for start in _KEYWORD_START.finditer(low):
        pos = start.start()
        if pos < last:
            continue
        match = regex.match(text, pos)
        if match is None:
            continue
        out.append(text[last:pos])
        out.append(replace(match))
        last = match.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def redact(text: str) -> str:
    """Replace secrets in `text` with `[REDACTED:<kind>]` markers. Pure; never raises."""
    return _redact(text, gated=True)


def _redact(text: str, *, gated: bool) -> str:
    """redact(); `gated=False` runs every regex whose triggers are present (the behaviour
    before the gates, which the tests compare the gated path with)."""
    if len(text) < 10:  # shorter than any pattern with its context
        return text
    gates = _Gates(text)
    done = -1  # patterns up to this index have been applied
    while done < len(SECRET_PATTERNS) - 1:
        for i in gates.candidates() if gated else _ALL:
            if i <= done:
                continue
            done = i
            pattern = SECRET_PATTERNS[i]
            if not gates.has_trigger(pattern) or (gated and not gates.has_literal(pattern)):
                continue
            if gated and pattern.kind == "password_assignment" and text.isascii():
                new = _sub_password_assignment(pattern, text, gates.low)
            else:
                new = pattern.regex.sub(_REPLACERS[pattern.kind], text)
            if new != text:  # rare: the gates must see the new text
                text = new
                gates = _Gates(text)
                break
        else:
            break
    if gated and gates.b64 < _HIGH_ENTROPY_MIN:
        return text
    return _HIGH_ENTROPY_CANDIDATE.sub(_high_entropy, text)
