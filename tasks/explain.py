"""`fenced explain RUN`: why a run went the way it did, in plain sentences read from its ledger alone.

Every answer is built from checkpoints.ledger entries (and the run row for where it is now), so it is
the same on any machine, after any crash, without logs. A topic appears only when the run went
through that path: retried, dead-lettered, touched by more than one worker, charged, an effect made,
resumed, waited. Text from users and models (a question, an error) is quoted as recorded.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from checkpoints import ledger
from checkpoints.ledger import Entry
from tasks import service

QUESTIONS = {
    "outcome": "What happened to it?",
    "retried": "Why was it retried, and how often?",
    "dead_letter": "Why is it in the dead letters?",
    "workers": "Why did more than one worker touch it?",
    "charged_once": "Why was it not charged twice?",
    "effects_once": "Why was no effect (a cart card, an order) made twice?",
    "resumed": "Why did it resume instead of restarting, and from which checkpoint?",
    "waited": "Why did it wait, and for what?",
    "routed": "Why did it go to the worker it went to?",
}
CLAIMS = ("claimed", "takeover")
TERMINAL = ("done", "failed", "cancelled")
EFFECTS = ("effect_created", "effect_reused", "effect_renewed", "order_placed")


@dataclass(frozen=True)
class Answer:
    """One question about the run (`topic`, a key of QUESTIONS) and its answer, one sentence per item, each
    naming the time (UTC), the holder's epoch and the worker of the ledger entry it reads."""

    topic: str
    question: str
    sentences: list[str]


@dataclass(frozen=True)
class Explanation:
    """A run explained: where it is now (`summary`) and the answers that apply to it, in QUESTIONS order."""

    run_id: str
    state: str
    summary: str
    answers: list[Answer]

    def answer(self, topic: str) -> Answer | None:
        """The answer on `topic`, or None when the run never went that way."""
        return next((a for a in self.answers if a.topic == topic), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain(run_id: str, user_id: str | None = None) -> Explanation:
    """Explain `run_id` as `user_id` may see it (None: an operator). RunNotFound for another user's run,
    as for a missing one. Read-only (the row, then the ledger): safe at any time, during a takeover too;
    an entry committed after the read simply is not in this answer yet."""
    run = service.get_run(run_id, user_id)
    entries = ledger.history(run.run_id)
    x = _Reader(entries)
    answers = [a for a in (x.outcome(run), x.retried(), x.dead_letter(run), x.workers(), x.charged_once(run),
                           x.effects_once(), x.resumed(), x.waited(run), x.routed()) if a is not None]
    summary = (f"Run {run.run_id} ({run.agent}, {run.kind}) of user {run.user_id} was submitted at "
               f"{_when(run.created_at_ms, date=True)}; it is {run.state} at step {run.step}, epoch {run.epoch}, "
               f"after {sum(e.kind in CLAIMS for e in entries)} claim(s) by {len(x.processes())} worker process(es).")
    return Explanation(run.run_id, run.state, summary, answers)


def _when(ms: int, date: bool = False) -> str:
    fmt = "%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime(fmt)[:-3] + (" UTC" if date else "")


def _answer(topic: str, sentences: list[str]) -> Answer | None:
    return Answer(topic, QUESTIONS[topic], sentences) if sentences else None


class _Reader:
    """One run's ledger, with the names and steps its entries imply."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.names = _worker_names(entries)
        # The step each holder (epoch) claimed: claims say it in their reason.
        self.step_of: dict[int, int] = {}
        for e in entries:
            m = re.search(r"step (\d+)", e.reason)
            if e.kind in CLAIMS and m:
                self.step_of[e.epoch] = int(m.group(1))

    def of(self, *kinds: str) -> list[Entry]:
        return [e for e in self.entries if e.kind in kinds]

    def who(self, e: Entry) -> str:
        return self.names.get(e.actor, e.actor)

    def at(self, e: Entry) -> str:
        """`at 12:00:01.123 (epoch 2, w1@host pid 7)`: when, which holder, which worker."""
        holder = f"epoch {e.epoch}, " if e.epoch > 0 else ""
        return f"at {_when(e.at_ms)} ({holder}{self.who(e)})"

    def processes(self) -> list[str]:
        """The worker processes that claimed the run, in order of their first claim."""
        seen: dict[str, None] = {}
        for e in self.of(*CLAIMS):
            seen.setdefault(_process(e.actor), None)
        return list(seen)

    # -- the answers -------------------------------------------------------------------------------
    def outcome(self, run: Any) -> Answer | None:
        said = [f"{self.at(e)}: {e.reason}." for e in self.of(*TERMINAL, "expired", "step_timeout", "promoted")]
        if run.error_class == "expired":
            said.append(f"It expired: {run.error}.")
        if run.state in ("queued", "running") and not said:
            said.append(f"It is {run.state}: it has not ended yet.")
        return _answer("outcome", said)

    def routed(self) -> Answer | None:
        """FENCED_ROUTING=reach: each wake-up's routing decision with the scores behind it (routing/)."""
        return _answer("routed", [f"{self.at(e)}: {e.reason}." for e in self.of("routed")])

    def retried(self) -> Answer | None:
        retries = self.of("retry")
        if not retries:
            return None
        classes = sorted({str(e.detail.get("class", "transient")) for e in retries})
        said = [f"It was retried {len(retries)} time(s), each for a {' or '.join(classes)} failure: one that may "
                "succeed when tried again, so the step waited (exponential backoff with jitter) and tried again "
                "within its retry budget instead of failing the run."]
        by_step: dict[int, int] = {}
        for e in retries:
            step = self.step_of.get(e.epoch, -1)
            by_step[step] = by_step.get(step, 0) + 1
        said.append("Retries per step: " + ", ".join(f"step {s}: {n}" for s, n in sorted(by_step.items())) + ".")
        said += [f"{self.at(e)}, step {self.step_of.get(e.epoch, '?')}: {e.reason}." for e in retries]
        return _answer("retried", said)

    def dead_letter(self, run: Any) -> Answer | None:
        dead = self.of("dead_lettered")
        if not dead:
            return None
        said = []
        for d in dead:
            step = self.step_of.get(d.epoch, run.step)
            claims = [e for e in self.of(*CLAIMS) if self.step_of.get(e.epoch) == step and e.id <= d.id]
            if "without finishing" in d.reason:
                why = (f"every delivery of step {step} ended before finishing it (its worker crashed, was killed or "
                       f"hung), so when step {step} was claimed again past max_deliveries the run was set aside "
                       "instead of being run once more")
            elif "retries" in d.reason:
                why = "a transient failure outlived the step's retry budget"
            else:
                why = "its step could not finish"
            said.append(f"{self.at(d)} it was dead-lettered because {why}: {d.reason}.")
            if claims:
                said.append(f"Step {step} was claimed {len(claims)} time(s): "
                            + "; ".join(f"{_when(c.at_ms)} epoch {c.epoch} by {self.who(c)}" for c in claims) + ".")
            said.append(f"Attempts in its case file: {d.detail.get('attempts', '?')} "
                        f"({d.detail.get('attempts_of_step', '?')} of step {step}). Its credit hold stays held, so "
                        "a replay can settle it (`fenced dlq show` / `fenced dlq replay`).")
        for e in self.of("replayed"):
            said.append(f"{self.at(e)}: {e.reason}.")
        if run.state != "dead":
            said.append(f"It is not in the dead letters any more: it is {run.state} now.")
        return _answer("dead_letter", said)

    def workers(self) -> Answer | None:
        procs = self.processes()
        fenced = self.of("fence_rejected")
        if len(procs) < 2 and not fenced:
            return None
        epochs: dict[str, list[int]] = {}
        for e in self.of(*CLAIMS):
            epochs.setdefault(_process(e.actor), []).append(e.epoch)
        said = [f"{len(procs)} worker process(es) held it: "
                + "; ".join(f"{self.names.get(p, p)} (epoch(s) {', '.join(map(str, epochs[p]))})" for p in procs)
                + ". Each claim raised the epoch by one, and every write carries its holder's epoch, so only "
                "the newest holder could write."]
        takeovers = self.of("takeover")
        for t in takeovers:
            prev = str(t.detail.get("previous_owner"))
            said.append(f"{self.at(t)} took it over from {self.names.get(prev, prev)} "
                        f"(epoch {t.detail.get('previous_epoch', t.epoch - 1)}), because {self._cause(t)}.")
        handovers = len(self.of("claimed")) - 1 - len(self.of("replied", "requeued", "replayed"))
        if handovers > 0 and len(procs) > 1:
            said.append("Between steps nothing is held: each step hands the run over after its checkpoint B, so the "
                        "next step runs on whichever worker takes its wake-up first.")
        for e in fenced:
            said.append(f"{self.at(e)}: {e.reason} (a newer epoch owned the run, so this holder stopped "
                        "without writing anything else).")
        return _answer("workers", said)

    def _cause(self, takeover: Entry) -> str:
        """Why the previous holder lost the run: the rescue or timeout recorded after its claim."""
        note = takeover_note(self.entries, takeover)
        if note is None:
            return (f"its holder let step {self.step_of.get(takeover.epoch, '?')} go unfinished and a wake-up found "
                    "no lease (a redelivered or duplicate message)")
        return f"{note.reason} (recorded {_when(note.at_ms)} by {self.who(note)})"

    def charged_once(self, run: Any) -> Answer | None:
        settled = self.of("settled")
        said = [f"{self.at(e)} the hold was settled: {e.reason}. Settling is part of the run's terminal transaction "
                "and changes a hold only while it is still 'held', so a second settlement could charge nothing."
                for e in settled]
        said += [f"{self.at(e)} a second settlement found the hold no longer held and charged nothing."
                 for e in self.of("settle_skipped")]
        said += [f"{self.at(e)}: {e.reason}." for e in self.of("model_call_lost", "hold_reopened", "hold_released")]
        for t in self.of("takeover"):
            if t.detail.get("phase") == "decided":
                said.append(f"{self.at(t)} resumed from checkpoint A, so the model call of step "
                            f"{self.step_of.get(t.epoch, '?')} was replayed from its record, not paid again.")
        if not settled and not run.ended:
            said += [f"Nothing is charged yet: {e.reason}." for e in self.of("submitted")]
        return _answer("charged_once", said)

    def effects_once(self) -> Answer | None:
        said = []
        for e in self.of(*EFFECTS):
            if e.kind == "effect_created":
                said.append(f"{self.at(e)}: {e.reason} (request key: run, action and the decision's fingerprint).")
            elif e.kind == "effect_reused":
                said.append(f"{self.at(e)} the same decision was replayed and its request key was found done: "
                            f"{e.reason}; nothing was made again.")
            elif e.kind == "effect_renewed":
                said.append(f"{self.at(e)} the first result could no longer be used, so a new one was made and "
                            f"recorded under the same key: {e.reason}.")
            else:
                said.append(f"{self.at(e)}: {e.reason}.")
        return _answer("effects_once", said)

    def resumed(self) -> Answer | None:
        said = []
        for e in self.of(*CLAIMS, "replayed"):
            m = re.search(r"(from checkpoint A of step \d+.*|after checkpoint B of step \d+.*|resumes step .*"
                          r"|at the start of step \d+.*)", e.reason)
            if e.kind == "claimed" and (m is None or "checkpoint A" not in e.reason):
                continue  # a plain next step (or a first start): nothing was resumed
            where = m.group(1) if m else "at the start of its step (no checkpoint of it yet)"
            what = {"takeover": "took it over and resumed", "replayed": "replayed the dead letter, which",
                    "claimed": "claimed it and resumed"}[e.kind]
            said.append(f"{self.at(e)} {what} {where}.")
        if said:
            said.append("A run's checkpoints are in the database: A after each model call (the decision and its "
                        "usage), B after its tools (the step's results); a resume starts from the last one written, "
                        "so finished steps are never run again and a recorded decision is never paid again.")
        return _answer("resumed", said)

    def waited(self, run: Any) -> Answer | None:
        said = []
        for e in self.of("waiting", "replied", "requeued"):
            if e.kind == "waiting":
                said.append(f"{self.at(e)} it was parked ({e.reason}). No worker held it while it waited, and "
                            "waiting did not count against its crash budget.")
            else:
                said.append(f"{self.at(e)}: {e.reason}.")
                nxt = next((c for c in self.of(*CLAIMS) if c.id > e.id), None)
                if nxt is not None:
                    said.append(f"It resumed {_when(nxt.at_ms)} on {self.who(nxt)} (epoch {nxt.epoch}), "
                                f"{(nxt.at_ms - e.at_ms) / 1000:.1f} s after the reply.")
        if run.state == "waiting" and run.error:
            said.append(f"It is waiting now for an answer to: {run.error}")
        return _answer("waited", said)


# A rescue's reason (fencing.reaper, fencing.liveness, fencing.sweeper) names why the holder lost the run.
CAUSES = (("pool child", "child_death"), ("presumed dead", "fast_takeover"), ("lease expired", "lease_expiry"),
          ("no lease and no progress", "sweeper"))


def takeover_note(entries: list[Entry], takeover: Entry) -> Entry | None:
    """The entry that says why `takeover`'s previous holder lost the run: a step_timeout recorded after
    that holder's claim, else the first rescue after it; None when neither is (yet) in `entries` (a rescue's
    entry commits just after its wake-up is sent, so a takeover can be read before it)."""
    prev_epoch = int(takeover.detail.get("previous_epoch", takeover.epoch - 1))
    prev_claim = next((e.id for e in reversed(entries) if e.kind in CLAIMS and e.epoch == prev_epoch), 0)
    notes = [e for e in entries if e.kind in ("rescue", "step_timeout") and e.id > prev_claim]
    return next((e for e in notes if e.kind == "step_timeout"), notes[0] if notes else None)


def takeover_cause(entries: list[Entry], epoch: int, final: bool = True) -> str | None:
    """The takeover by holder `epoch` as a metric label: child_death, fast_takeover, lease_expiry, sweeper,
    step_timeout, other (a rescue of another kind) or no_rescue (none recorded). None while no reason is
    recorded yet and not `final` (a rescue's entry is written just after its wake-up is sent)."""
    takeover = next((e for e in entries if e.kind == "takeover" and e.epoch == epoch), None)
    note = takeover_note(entries, takeover) if takeover is not None else None
    if note is None:
        return "no_rescue" if final else None
    if note.kind == "step_timeout":
        return "step_timeout"
    return next((label for words, label in CAUSES if words in note.reason), "other")


def _process(actor: str) -> str:
    """A lease token `host:pid:nonce/delivery` without its delivery part: one worker process."""
    return actor.split("/", 1)[0]


def _worker_names(entries: list[Entry]) -> dict[str, str]:
    """Tokens (and processes) as people know workers: `w1@host pid 7` from the claims' recorded node name,
    else `pid 7 on host`; a person or a front end keeps its own name."""
    names: dict[str, str] = {}
    for e in entries:
        parts = _process(e.actor).split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        node = e.detail.get("node") if e.kind in CLAIMS else None
        name = f"{node} pid {parts[1]}" if node else f"pid {parts[1]} on {parts[0]}"
        for key in (e.actor, _process(e.actor)):
            if node or key not in names:
                names[key] = name
    return names
