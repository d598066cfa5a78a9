"""Privacy: secrets redacted in stored rows and in every export, `metrics` consent keeps
no code anywhere, excluded files keep no code, and `forget` leaves no bytes behind in the file."""

from __future__ import annotations

import functools
import sqlite3
import uuid
import zlib
from pathlib import Path

import pytest

from telemetry import (
    PrivacyPolicy,
    Recorder,
    export,
    forget,
    privacy,
    redact,
    redaction,
    store,
    workspace_id,
)
from tests.telemetry.conftest import all_text, count, record_session

# Realistic but fake secrets, assembled at run time so that no scanner mistakes this file for a
# leak: (kind, text as it would appear in code/prompts/tool output, the secret part).
_B62 = "Zq8vP2xR7mT4nL9wK3jH6fD1sA5gY0eUbC4iO7"
SECRETS: list[tuple[str, str, str]] = [
    ("aws_access_key", "aws_access_key_id = {s}", "AKIA" + "Q3WZ7TRS2KLMXY5B"),
    (
        "aws_secret_key",
        'aws_secret_access_key = "{s}"',
        "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYzq8vP2xR7mT4",
    ),
    ("github_classic", "git clone https://{s}@github.com/acme/app", "ghp_" + _B62[:36]),
    ("github_fine_grained", "GITHUB_TOKEN={s}", "github_pat_" + "11ABCDE2Y0" + _B62[:30]),
    ("gitlab", "export GL={s}", "glpat-" + "xY3_kq9ZtR2vLm8wPn4s"),
    ("slack_bot", "client = WebClient('{s}')", "xoxb-" + "123456789012-1234567890123-" + _B62[:24]),
    (
        "slack_webhook",
        "requests.post('https://hooks.slack.com/services/{s}', json=msg)",
        "T0ABC1234/B0DEF5678/" + _B62[:24],
    ),
    ("openai_project", "client = OpenAI(api_key='{s}')", "sk-proj-" + _B62 + "Ab3dE5"),
    ("openai_legacy", "openai.api_key = {s}", "sk-" + _B62[:32] + "T3BlbkFJ"),
    ("anthropic", "ANTHROPIC_API_KEY: {s}", "sk-ant-api03-" + _B62 + "-xYz9"),
    ("huggingface", "login(token='{s}')", "hf_" + _B62[:34]),
    ("google", "const key = '{s}';", "AIza" + "SyD8vP2xR7mT4nL9wK3jH6fD1sA5gY0eUbC"),
    ("stripe", "stripe.api_key = '{s}'", "sk_live_" + "51HqLkM2eZvKYlo2C" + _B62[:16]),
    ("twilio", "TWILIO_KEY_SID={s}", "SK" + "2f9c8e7d6b5a41302f9c8e7d6b5a4130"),
    ("sendgrid", "sg = SendGridAPIClient('{s}')", "SG." + "nR4xQ9vL2kT8mW3z" + "." + _B62[:30]),
    ("npm", "//registry.npmjs.org/:_authToken={s}", "npm_" + _B62[:36]),
    ("pypi", "password = {s}", "pypi-" + "AgEIcHlwaS5vcmc" + _B62 + "xx"),
    (
        "jwt",
        "curl -H 'Authorization: Bearer {s}' https://api.internal",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
        + ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkphbmUifQ"
        + ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ),
    (
        "rsa_private_key",
        "key = '''{s}'''",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgH"
        "\nc3MQ8pZ1ke0iMc6VF2pS1wGk8OgN4yDmXt3IVbaM6gPX9mFGtLj\n-----END RSA PRIVATE KEY-----",
    ),
    (
        "openssh_private_key",
        "cat ~/.ssh/id_ed25519\n{s}\n",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"
        "\nQyNTUxOQAAACBqZ3VzdGFub3RoZXJmYWtla2V5Zm9ydGVzdGluZwAAAJg=\n"
        "-----END OPENSSH PRIVATE KEY-----",
    ),
    ("password_assignment", 'DB_PASSWORD = "{s}"', "Tr0ub4dor&3xyz!"),
    ("password_yaml", "  password: {s}\n  user: admin", "c0rrect-h0rse-battery"),
    (
        "postgres_url",
        "DATABASE_URL=postgres://admin:{s}@db.internal:5432/app",
        "S3cr3tP4ssw0rd",
    ),
    (
        "mysql_url",
        "engine = create_engine('mysql+pymysql://root:{s}@localhost/shop')",
        "hunter2pass",
    ),
    ("client_secret", '"client_secret": "{s}",', "8Q~vX2.rT9_kLm3WnP7zQ4sY6uB1"),
    (
        "high_entropy_config",
        "SIGNING = '{s}'  # no keyword at all",
        "Zq8vP2xR7mT4nL9wK3jH6fD1sA5gY0eU",
    ),
    ("basic_auth_header", "headers = {{'X-Api-Key': '{s}'}}", "f7Kp2Qz9Lm4Xw8Rt6Yv3Bn1"),
]


def _step(recorder: Recorder, sid: str, tid: str, idx: int, role: str, **fields) -> str:
    """One step of task `tid` in session `sid`."""
    return recorder.record("step", session_id=sid, task_id=tid, idx=idx, role=role, **fields)


def _read(call_id: str, path: str) -> dict:
    """A `read_file` tool call of `path`."""
    return {"id": call_id, "name": "read_file", "arguments": {"path": path}}


def _texts() -> list[tuple[str, str, str]]:
    return [(kind, template.format(s=secret), secret) for kind, template, secret in SECRETS]


def test_at_least_twenty_realistic_secrets():
    assert len(SECRETS) >= 20
    assert len({secret for _, _, secret in SECRETS}) == len(SECRETS)


@pytest.mark.parametrize(("kind", "text", "secret"), _texts(), ids=[k for k, _, _ in SECRETS])
def test_redact_removes_each_secret(kind: str, text: str, secret: str):
    out = redact(text)
    assert "[REDACTED:" in out
    # no 8-character piece of the secret survives
    for i in range(0, max(1, len(secret) - 8), 4):
        assert secret[i : i + 8] not in out, (kind, out)


@pytest.mark.parametrize(
    "text",
    [
        "git_head = '3f786850e387550fdab836ed7e6dc881de23001b'",
        "def check_password(pw: str) -> bool:\n    return hash(pw) == stored",
        "password = os.environ['DB_PASSWORD']",
        "token: str | None = None",
        "self.api_key = api_key",
        "TOKEN_URL = 'https://example.com/oauth/token'",
        "author = 'Jane Doe'",
        "very_long_function_name_for_tests_and_more()",
        "import numpy as np\nx = np.zeros((3, 4))",
        "uuid = '6fa459ea-ee8a-3ca4-894e-db77e160355e'",
    ],
)
def test_ordinary_code_is_left_alone(text: str):
    assert redact(text) == text


def _gate_corpus() -> list[str]:
    """Texts for the gated-vs-reference check: every secret alone, in its template, inside a
    longer file, next to another secret, in upper/lower case variants and cut short, plus code
    and prose that must come back unchanged, and non-ASCII text around secrets."""
    texts = []
    filler = "def load(path):\n    with open(path) as f:\n        return f.read()  # é ✓\n"
    for _, template, secret in SECRETS:
        line = template.format(s=secret)
        texts += [secret, line, filler + line + "\n" + filler, line.upper(), line.lower()]
        texts += [line[: len(line) // 2], secret[:-3], f"x{secret}", f"ſ{line}", f"{line}\u212a"]
    texts += [a + " " + b for (_, a, _), (_, b, _) in zip(_texts(), _texts()[1:], strict=False)]
    texts += ["token = x" * 20, "password: hunter22 " * 30, "Bearer " + "A1b2" * 10, filler * 50]
    return texts


def test_gated_redaction_equals_the_ungated_reference():
    """The cheap gates (token runs, literals, keyword positions) only skip regexes that could not
    match: on every sample the result is exactly what running every regex gives."""
    for text in _gate_corpus():
        assert redaction.redact(text) == redaction._redact(text, gated=False), text


def test_each_gate_is_a_necessary_condition_of_its_pattern():
    """Every secret sample that a pattern redacts passes that pattern's gates."""
    for _, template, secret in SECRETS:
        for text in (secret, template.format(s=secret)):
            gates = redaction._Gates(text)
            for i, pattern in enumerate(redaction.SECRET_PATTERNS):
                if pattern.regex.sub(redaction._REPLACERS[pattern.kind], text) != text:
                    assert i in gates.candidates() and gates.has_literal(pattern), pattern.kind
                    assert gates.has_trigger(pattern), pattern.kind


def _udiff(path: str, before: str, after: str) -> str:
    import difflib

    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    old = "/dev/null" if not before else f"a/{path}"
    return "".join(difflib.unified_diff(a, b, old, f"b/{path}"))


def test_drop_excluded_files_from_a_diff():
    keep = _udiff("app.py", "x = 1\n-- a comment that looks like a header\ny = 2\n", "x = 2\n")
    env = _udiff(".env", "A=1\n", "A=2\nSECRET_VALUE=abc\n")
    new_key = _udiff("deploy/server.key", "", "KEYDATA\n")
    tail = _udiff("b.py", "y\n", "z\n")
    diff = keep + env + new_key + tail
    out = privacy.drop_excluded_files(diff, privacy.DEFAULT_EXCLUDE)
    assert out == keep + privacy.EXCLUDED_DIFF_MARK * 2 + tail
    assert "--- a comment" in out  # a removed line, not a header: app.py's section is whole
    # git-style headers name the file too
    git = "diff --git a/.env b/.env\nindex 1..2 100644\n" + env
    assert privacy.drop_excluded_files(keep + git, privacy.DEFAULT_EXCLUDE) == (
        keep + privacy.EXCLUDED_DIFF_MARK
    )
    # nothing excluded, no globs, or not a diff at all: unchanged
    assert privacy.drop_excluded_files(keep + tail, privacy.DEFAULT_EXCLUDE) == keep + tail
    assert privacy.drop_excluded_files(diff, ()) == diff
    assert privacy.drop_excluded_files("no diff here", privacy.DEFAULT_EXCLUDE) == "no diff here"


def test_secrets_in_code_prompts_and_tool_output_are_redacted_in_rows_and_exports(
    recorder: Recorder, db_path: Path, tmp_path: Path
):
    sid = recorder.record("session_start", editor="vscode")
    blob = "\n".join(text for _, text, _ in _texts())
    tid = recorder.record(
        "task_start",
        session_id=sid,
        instruction=f"deploy with this config:\n{blob}",  # a prompt
        workspace_files={"deploy/settings.py": blob},  # code
        verify_command="pytest -q",
    )
    recorder.record("step", session_id=sid, task_id=tid, idx=0, role="user", content=blob)
    recorder.record(
        "step",
        session_id=sid,
        task_id=tid,
        idx=1,
        role="assistant",
        content="Let me look.",
        tool_calls=[{"id": "c1", "name": "run", "arguments": {"cmd": f"echo '{blob}'"}}],
    )
    recorder.record(
        "step", session_id=sid, task_id=tid, idx=2, role="tool", tool_call_id="c1", result=blob
    )
    recorder.record(
        "suggestion", session_id=sid, kind="inline", output=blob, context={"prefix": blob}
    )
    recorder.record("file", session_id=sid, document_uri="file:///w/settings.py", text=blob)
    recorder.record(
        "task_end",
        session_id=sid,
        task_id=tid,
        status="done",
        final_message=blob,
        stop_reason="answered",
        stop_detail=blob,
        diff="--- a/settings.py\n+++ b/settings.py\n@@ -0,0 +1 @@\n+" + blob.replace("\n", " "),
    )
    recorder.record(
        "outcome", session_id=sid, task_id=tid, tests_after_passed=1, tests_after_failed=0
    )
    assert recorder.flush()

    stored = all_text(db_path)
    assert "[REDACTED:" in stored
    out = tmp_path / "export"
    export(db_path, out, min_reward=-10, held_out_percent=0)
    exported = "\n".join(p.read_text() for p in sorted(out.glob("*.jsonl")))
    assert "settings.py" in exported and "[REDACTED:" in exported
    for kind, _, secret in SECRETS:
        pieces = [secret[i : i + 8] for i in range(0, max(1, len(secret) - 8), 4)]
        for piece in pieces:
            assert piece not in stored, (kind, "stored")
            assert piece not in exported, (kind, "exported")
            # JSON escapes newlines in private keys; check the escaped form too
            assert piece.replace("\n", "\\n") not in exported, (kind, "exported")


def test_metrics_consent_stores_no_code_in_any_text_column(db_path: Path):
    marker = "CODEMARK" + uuid.uuid4().hex[:8]
    with Recorder(db_path, PrivacyPolicy(consent="metrics")) as rec:
        ids = record_session(rec, marker)
        assert rec.flush()
    text = all_text(db_path)
    assert marker not in text and marker.lower() not in text
    raw = b"".join(p.read_bytes() for p in db_path.parent.iterdir())
    assert marker.encode() not in raw
    # ...while the metrics are all there
    assert count(db_path, "SELECT consent FROM sessions") == "metrics"
    assert count(db_path, "SELECT latency_ms FROM suggestions") == 41.5
    assert count(db_path, "SELECT COUNT(*) FROM steps WHERE task_id = ?", ids["task"]) == 6
    assert count(db_path, "SELECT COUNT(*) FROM steps WHERE tool_calls_hash IS NOT NULL") == 2
    assert count(db_path, "SELECT final_message_chars FROM tasks") > 0
    assert count(db_path, "SELECT diff_chars FROM tasks") > 0  # the size of the diff, not it
    assert count(db_path, "SELECT stop_reason FROM tasks") == "answered"
    assert count(db_path, "SELECT diff IS NULL AND stop_detail IS NULL FROM tasks") == 1
    assert count(db_path, "SELECT tests_after_passed FROM outcomes") == 4
    assert count(db_path, "SELECT COUNT(*) FROM blobs") == 0
    # paths are reduced to an opaque hash that keeps the extension
    uri = count(db_path, "SELECT document_uri FROM suggestions")
    assert uri.startswith("sha256:") and uri.endswith(".py") and "main" not in uri


def test_excluded_files_keep_no_code(recorder: Recorder, db_path: Path):
    secret_text = "EXCLUDED-" + uuid.uuid4().hex[:12]
    sid = recorder.record("session_start")
    recorder.record(
        "suggestion",
        session_id=sid,
        kind="inline",
        document_uri="file:///w/.env",
        output=secret_text,
    )
    recorder.record("file", session_id=sid, document_uri="/home/u/.ssh/id_rsa", text=secret_text)
    recorder.record("file", session_id=sid, document_uri="certs/server.pem", text=secret_text)
    tid = recorder.record(
        "task_start",
        session_id=sid,
        instruction="read the config",
        workspace_files={".env.local": secret_text, "app.py": "print(1)"},
    )
    step = functools.partial(_step, recorder, sid, tid)
    step(0, "assistant", tool_calls=[_read("c", "config/.env")])
    # the tool result of that read: excluded by its call id, and by position without one
    step(1, "tool", tool_call_id="c", result=secret_text)
    step(2, "assistant", tool_calls=[_read("d", "deploy/prod.pem")])
    step(3, "tool", result=secret_text)
    step(4, "assistant", content="ok")
    recorder.record(
        "edit",
        session_id=sid,
        document_uri="file:///w/prod.key",
        hunks=[{"replacement": secret_text}],
    )
    diff = (
        "--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-print(0)\n+print(2)\n"
        f"--- /dev/null\n+++ b/config/.env\n@@ -0,0 +1 @@\n+TOKEN_NAME={secret_text}\n"
    )
    recorder.record("task_end", session_id=sid, task_id=tid, status="done", diff=diff)
    assert recorder.flush()
    text = all_text(db_path)
    assert secret_text not in text
    assert "print(1)" in text  # the non-excluded workspace file is kept
    stored_diff = count(db_path, "SELECT diff FROM tasks")
    assert "+print(2)" in stored_diff and privacy.EXCLUDED_DIFF_MARK in stored_diff
    assert count(db_path, "SELECT excluded FROM suggestions") == 1
    assert count(db_path, "SELECT COUNT(*) FROM files") == 0


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        (".env", True),
        ("app/.env.production", True),
        ("file:///home/u/keys/server.key", True),
        ("/home/u/.ssh/id_ed25519", True),
        ("/home/u/.aws/credentials", True),
        ("secrets.yaml", True),
        ("app/main.py", False),
        ("environment.py", False),
        ("docs/keyboard.md", False),
    ],
)
def test_default_exclusion_globs(path: str, excluded: bool):
    assert privacy.is_excluded(path, privacy.DEFAULT_EXCLUDE) is excluded


def _raw(db_path: Path) -> bytes:
    return b"".join(
        Path(str(db_path) + s).read_bytes() for s in ("", "-wal") if Path(str(db_path) + s).exists()
    )


def _forget_fixture(db_path: Path, *, keep_open: bool = False):
    gone = "FORGETME-" + uuid.uuid4().hex[:12]
    kept = "KEEPME-" + uuid.uuid4().hex[:12]
    rec = Recorder(db_path)
    a = record_session(rec, gone, workspace_id=workspace_id("/work/secret-project"))
    b = record_session(rec, kept, workspace_id=workspace_id("/work/other"))
    assert rec.flush()
    code_a = f"def {gone.lower()}_fn():\n    return '{gone}'\n".encode()
    compressed = zlib.compress(code_a, 6)
    raw = _raw(db_path)
    assert gone.encode() in raw and compressed in raw  # the scan can see both forms
    if not keep_open:
        rec.close()
    return rec, gone, kept, compressed, a, b


@pytest.mark.parametrize("keep_open", [False, True], ids=["closed", "recorder-open"])
def test_forget_session_leaves_no_bytes_in_the_file(db_path: Path, keep_open: bool):
    rec, gone, kept, compressed, a, b = _forget_fixture(db_path, keep_open=keep_open)
    report = forget(db_path, session_id=a["session"])
    assert report.sessions == 1 and report.blobs >= 2 and report.wal_truncated
    raw = _raw(db_path)
    assert gone.encode() not in raw
    assert compressed not in raw
    assert gone.lower().encode() not in raw
    assert kept.encode() in raw  # the other session is untouched
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    for table in ("sessions", "tasks", "steps", "suggestions", "blob_refs", "files", "hunks"):
        ids = [
            r[0]
            for r in conn.execute(
                f"SELECT {'id' if table == 'sessions' else 'session_id'} FROM {table}"
            )
        ]
        assert a["session"] not in ids and b["session"] in ids, table
    conn.close()
    if keep_open:  # the recorder goes on working after the file was rewritten under it
        assert rec.record("feedback", session_id=b["session"], rating=1)
        assert rec.flush()
        rec.close()
        assert count(db_path, "SELECT COUNT(*) FROM feedback") == 2


def test_forget_workspace_by_path_and_everything(db_path: Path):
    _, gone, kept, compressed, a, b = _forget_fixture(db_path)
    report = forget(db_path, workspace="/work/secret-project")
    assert report.sessions == 1
    raw = _raw(db_path)
    assert gone.encode() not in raw and compressed not in raw and kept.encode() in raw
    report = forget(db_path, everything=True)
    assert report.sessions == 1
    raw = _raw(db_path)
    assert kept.encode() not in raw
    assert count(db_path, "SELECT COUNT(*) FROM blobs") == 0
    migrations = count(db_path, "SELECT COUNT(*) FROM _migrations")
    assert migrations == len(store.MIGRATIONS)  # still a working database


def test_forget_keeps_a_blob_another_session_still_uses(recorder: Recorder, db_path: Path):
    shared = "SHARED = 1\n" * 20
    s1 = recorder.record("session_start")
    s2 = recorder.record("session_start")
    for sid in (s1, s2):
        recorder.record("file", session_id=sid, document_uri="a.py", text=shared)
    assert recorder.flush()
    report = forget(db_path, session_id=s1)
    assert report.blobs == 0
    assert count(db_path, "SELECT COUNT(*) FROM blobs") == 1


def test_forget_needs_exactly_one_target(db_path: Path):
    with pytest.raises(ValueError):
        forget(db_path)
    with pytest.raises(ValueError):
        forget(db_path, session_id="x", everything=True)


def test_clean_text_and_policy_checks():
    assert privacy.clean_text("a\x00b", 10) == "a\u2400b"
    assert privacy.clean_text(b"\xff", 10) == "\ufffd"
    assert privacy.clean_text("x" * 20, 10) == "x" * 10 + "\n[truncated: 20 chars, kept 10]"
    assert privacy.clean_text(12.5, 10) == "12.5"
    with pytest.raises(ValueError):
        PrivacyPolicy(consent="everything")


def test_json_values_under_secret_names_are_redacted_but_file_names_are_not(
    recorder: Recorder, db_path: Path
):
    sid = recorder.record("session_start")
    tid = recorder.record(
        "task_start",
        session_id=sid,
        instruction="log in",
        workspace_files={"auth/tokenizer.py": "def tokenize(text):\n    return text.split()\n"},
    )
    calls = [
        {"id": "c", "name": "login", "arguments": {"user": "ann", "password": "plainpw"}},
        {"id": "d", "name": "login", "arguments": {"api_token": "${TOKEN}"}},
    ]
    _step(recorder, sid, tid, 0, "assistant", tool_calls=calls)
    assert recorder.flush()
    text = all_text(db_path)
    assert "plainpw" not in text and '"password": "[REDACTED:password_assignment]"' in text
    assert '"api_token": "${TOKEN}"' in text  # a placeholder, not a secret
    assert "return text.split()" in text  # a file is not a secret because of its name
