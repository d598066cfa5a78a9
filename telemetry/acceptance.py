"""Inline suggestions as outcomes, and their scores: one code path for real and simulated users.

Vocabulary (used by the simulated user, completion RL, the dashboard and the benchmark):

    request    the editor asked for a suggestion at a cursor
    declined   the model proposed nothing (empty output), or what it wrote was under its
               confidence threshold (`withheld`, agent/confidence.py): nothing was shown
    shown      a non-empty suggestion was displayed
    accepted   the user took it (all of it, or `partially_accepted` with `accepted_chars`)
    rejected   shown and not accepted (dismissed, typed over, ignored)
    kept       accepted characters still present after `KEPT_AFTER_S` (the survival checks)

Scores over a list of outcomes (`score`):

    accept_rate                 accepted / shown
    shown_per_request           shown / requests
    accepted_chars_per_request  accepted characters / requests (what the user got per ask)

`outcomes_from_db` reads the `suggestions`, `suggestion_events` and `survival` tables (a
suggestion with an empty output or a `withheld` event is a declined request; one with an
output but no event that put it on screen, cancelled or still pending, is left out); the simulated
user (training/simulated_user.py) produces the same records from a repository's held-out files,
so both are scored by `score`, and `signals` turns either into the signals of the versioned
reward `tab` (telemetry/rewards.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEPT_AFTER_S = 300  # a survival check at or after this many seconds says whether code was kept
# Events that mean the suggestion was on screen (`superseded`: replaced while the user typed on,
# which is a rejection); `cancelled` alone means it never was.
SHOWN_EVENTS = frozenset(
    {"shown", "accepted", "partially_accepted", "rejected", "ignored", "superseded"}
)


@dataclass
class Outcome:
    request_id: str  # suggestion id, or the simulated cursor (path:offset)
    output: str  # what the model proposed ("" = declined)
    shown: bool
    accepted_chars: int = 0  # characters taken (0 when rejected or not shown)
    kept: float | None = None  # share of accepted characters present after KEPT_AFTER_S
    extra: dict = field(default_factory=dict)  # context for training (prompt, expected text)

    @property
    def accepted(self) -> bool:
        return self.shown and self.accepted_chars > 0

    @property
    def rejected(self) -> bool:
        return self.shown and not self.accepted


def score(outcomes: list[Outcome]) -> dict[str, float]:
    """The scores above (zeros for an empty list)."""
    requests = len(outcomes)
    shown = sum(o.shown for o in outcomes)
    accepted = sum(o.accepted for o in outcomes)
    chars = sum(o.accepted_chars for o in outcomes if o.accepted)
    return {
        "requests": requests,
        "shown": shown,
        "accepted": accepted,
        "accept_rate": accepted / shown if shown else 0.0,
        "shown_per_request": shown / requests if requests else 0.0,
        "accepted_chars_per_request": chars / requests if requests else 0.0,
    }


def signals(outcome: Outcome) -> dict:
    """The outcome as reward signals (the vocabulary of telemetry/rewards.py)."""
    s: dict = {"shown": outcome.shown}
    if outcome.shown:
        s["accepted"] = outcome.accepted
        share = outcome.accepted_chars / len(outcome.output) if outcome.output else 0.0
        s["accepted_share"] = min(1.0, share)
        if outcome.kept is not None:
            s["survival"] = {KEPT_AFTER_S: outcome.kept}
    return s


def outcomes_from_db(conn, kind: str = "inline", since: float = 0.0) -> list[Outcome]:
    """Every `kind` suggestion created after `since`, oldest first, as outcomes (see above)."""
    rows = conn.execute(
        "SELECT id, output, context, document_uri FROM suggestions WHERE kind = ? "
        "AND created_at > ? ORDER BY created_at, id",
        (kind, since),
    ).fetchall()
    events: dict[str, list[tuple[str, int | None]]] = {}
    for sid, event, chars in conn.execute(
        "SELECT e.suggestion_id, e.event, e.accepted_chars FROM suggestion_events e "
        "JOIN suggestions s ON s.id = e.suggestion_id WHERE s.kind = ? ORDER BY e.at",
        (kind,),
    ):
        events.setdefault(sid, []).append((event, chars))
    kept: dict[str, float] = {}
    for sid, share in conn.execute(
        "SELECT suggestion_id, share FROM survival WHERE after_s >= ? AND share IS NOT NULL "
        "ORDER BY after_s",
        (KEPT_AFTER_S,),
    ):
        kept[sid] = float(share)  # the latest check wins
    out = []
    for sid, output, context, uri in rows:
        output = output or ""
        seen = {e for e, _ in events.get(sid, [])}
        shown = bool(output) and bool(seen & SHOWN_EVENTS)
        extra = {"context": context, "document_uri": uri}
        if output and not shown and "withheld" in seen:  # the model kept quiet: as declined
            output, extra["withheld"] = "", output
        if output and not shown:
            continue  # cancelled before it was shown, or no outcome yet: not a request to score
        taken = 0
        for event, chars in events.get(sid, []):
            if event == "accepted":
                taken = len(output)
            elif event == "partially_accepted":
                taken = max(taken, min(len(output), chars or 0))
        out.append(Outcome(sid, output, shown, taken if shown else 0, kept.get(sid), extra))
    return out
