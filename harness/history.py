"""The history checker: reads what the stores kept after a scenario and finds every broken promise.

Like a Jepsen checker it judges the history, not the row's opinion of itself: every epoch-tagged row
and ledger entry against the claims that superseded its epoch, each raw event stream in append order,
the paid model calls a test model counted where the runtime never writes, and each user's account
against the holds it carried. `verdict.check_run` judges one run's final state; this judges how it got
there. A violation names its condition (see CONDITIONS).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from checkpoints.db import transaction
from checkpoints.schema import (
    effects,
    run_checkpoints,
    run_holds,
    run_inputs,
    run_ledger,
    run_steps,
    user_accounts,
)
from examples.shopping.schema import cart_cards, orders
from fencing import events, metering

CONDITIONS = {
    "stale_write": "no row or ledger entry is written under an epoch after a higher epoch was claimed",
    "stream_order": "in each raw event stream no event of epoch e follows the first event of a higher epoch",
    "stream_duplicate": "no event id is appended twice under one epoch",
    "paid_once": "every paid model call is recorded at checkpoint A of its epoch, or was lost by a holder "
                 "that was superseded before checkpoint A; never two paid calls for one step of one epoch",
    "account": "per user: balance = starting balance - settled charges, held = open holds, no mismatch",
    "orders": "at most one order per card",
    "cards": "at most one card per decision (plus the renewals the ledger records)",
    "effect_recorded": "every holder whose stream shows an effect tool's result has that effect's ledger entry "
                       "(effect_created, effect_reused or effect_renewed) under its epoch",
}

# Conditions only a run nothing happened to must meet (`check_healthy`): chaos judges its control and
# neighbour runs by them, never runs it disturbed.
HEALTHY_CONDITIONS = {
    "healthy": "no takeover, rescue, fence rejection or step timeout in the ledger",
    "handoff_gap": "each step_started follows the previous step's step_done within the bound (a dropped "
                   "continuation waits a lease TTL for its rescue)",
}
# Ledger entries that say something went wrong with a holder.
TROUBLE_KINDS = frozenset({"takeover", "rescue", "fence_rejected", "step_timeout"})

# Ledger entries a holder writes under its own epoch while (it believes) it owns the run. Notes about
# a holder written by others or after the fact (fence_rejected, rescue, step_timeout) are not checked.
HOLDER_KINDS = frozenset({"claimed", "takeover", "retry", "waiting", "done", "failed", "dead_lettered",
                          "effect_created", "effect_reused", "effect_renewed"})
# Ledger entries that start an epoch.
CLAIM_KINDS = frozenset({"claimed", "takeover", "cancelled"})


@dataclass(frozen=True)
class Violation:
    """One broken promise: which condition, where (a run, or a user for account checks), and why."""

    condition: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where} {self.condition}: {self.detail}"


def check_history(run_ids: Iterable[str], start_balance: int | None = None) -> list[Violation]:
    """Check the history of `run_ids` and of their users' accounts. `start_balance`: what every one of
    those users started with (default: the settings' default balance: users new to this history)."""
    ids = sorted(set(run_ids))
    if not ids:
        return []
    if start_balance is None:
        from fenced_core.settings import get_settings

        start_balance = get_settings().default_balance_credits
    out: list[Violation] = []
    with transaction(readonly=True) as conn:
        superseded = _superseded_at(conn, ids)
        out += _stale_writes(conn, ids, superseded)
        out += _paid_calls(conn, ids, superseded)
        out += _cards_and_orders(conn, ids)
        users = sorted({r for (r,) in conn.execute(sa.select(run_checkpoints.c.user_id)
                                                   .where(run_checkpoints.c.run_id.in_(ids)))})
        out += _accounts(conn, ids, users, start_balance)
    for run_id in ids:
        out += _stream(run_id)
    out += _effects_recorded(ids)
    return out


def check_healthy(run_ids: Iterable[str], gap_ms: int = 1000) -> list[Violation]:
    """HEALTHY_CONDITIONS for runs nothing happened to (no kill, freeze or wipe touched them)."""
    ids = sorted(set(run_ids))
    if not ids:
        return []
    out: list[Violation] = []
    with transaction(readonly=True) as conn:
        for run_id, kind, reason in conn.execute(
                sa.select(run_ledger.c.run_id, run_ledger.c.kind, run_ledger.c.reason)
                .where(run_ledger.c.run_id.in_(ids), run_ledger.c.kind.in_(TROUBLE_KINDS))):
            out.append(Violation("healthy", run_id, f"{kind} in an undisturbed run: {reason}"))
    for run_id in ids:
        done_at: dict[int, int] = {}
        for ev in events.read(run_id):
            at = int(ev.stream_id.split("-")[0])
            if ev.type == "step_done":
                done_at.setdefault(ev.step, at)
            elif ev.type == "step_started" and ev.step - 1 in done_at:
                gap = at - done_at.pop(ev.step - 1)
                if gap > gap_ms:
                    out.append(Violation("handoff_gap", run_id, f"step {ev.step} started {gap} ms after step "
                                                                f"{ev.step - 1} was done (bound {gap_ms} ms)"))
    return out


def _superseded_at(conn: sa.Connection, ids: list[str]) -> dict[str, dict[int, int]]:
    """Per run, per epoch: when the first claim of a higher epoch was recorded (ms); absent = never."""
    started: dict[str, dict[int, int]] = defaultdict(dict)
    for run_id, epoch, at_ms in conn.execute(
            sa.select(run_ledger.c.run_id, run_ledger.c.epoch, run_ledger.c.at_ms)
            .where(run_ledger.c.run_id.in_(ids), run_ledger.c.kind.in_(CLAIM_KINDS))):
        prior = started[run_id].get(epoch)
        started[run_id][epoch] = at_ms if prior is None else min(prior, at_ms)
    out: dict[str, dict[int, int]] = {}
    for run_id, by_epoch in started.items():
        epochs = sorted(by_epoch)
        out[run_id] = {}
        for i, e in enumerate(epochs):
            later = [by_epoch[x] for x in epochs[i + 1:]]
            if later:
                out[run_id][e] = min(later)
    return out


def _stale_writes(conn: sa.Connection, ids: list[str], superseded: dict[str, dict[int, int]]) -> list[Violation]:
    rows: list[tuple[str, str, int, int]] = []  # (what, run_id, epoch, at_ms)
    for what, table, at in (("checkpoint", run_steps, run_steps.c.at_ms),
                            ("effect", effects, effects.c.created_at_ms),
                            ("card", cart_cards, cart_cards.c.created_at_ms),
                            ("question", run_inputs, run_inputs.c.asked_at_ms)):
        for run_id, epoch, at_ms in conn.execute(sa.select(table.c.run_id, table.c.epoch, at)
                                                 .where(table.c.run_id.in_(ids))):
            rows.append((what, run_id, epoch, at_ms))
    for run_id, epoch, at_ms, kind in conn.execute(
            sa.select(run_ledger.c.run_id, run_ledger.c.epoch, run_ledger.c.at_ms, run_ledger.c.kind)
            .where(run_ledger.c.run_id.in_(ids), run_ledger.c.kind.in_(HOLDER_KINDS))):
        rows.append((f"ledger {kind}", run_id, epoch, at_ms))
    out = []
    for what, run_id, epoch, at_ms in rows:
        cut = superseded.get(run_id, {}).get(epoch)
        if cut is not None and at_ms > cut:
            out.append(Violation("stale_write", run_id, f"{what} of epoch {epoch} written at {at_ms}, "
                                                        f"{at_ms - cut} ms after a higher epoch was claimed"))
    return out


def _paid_calls(conn: sa.Connection, ids: list[str], superseded: dict[str, dict[int, int]]) -> list[Violation]:
    decided = {(r, e, s) for r, e, s in conn.execute(
        sa.select(run_steps.c.run_id, run_steps.c.epoch, run_steps.c.step)
        .where(run_steps.c.run_id.in_(ids), run_steps.c.phase == "decided"))}
    out = []
    for run_id in ids:
        for (epoch, step), n in metering.paid_calls(run_id).items():
            if n > 1:
                out.append(Violation("paid_once", run_id, f"{n} paid model calls for step {step} under epoch {epoch}"))
            if (run_id, epoch, step) not in decided and epoch not in superseded.get(run_id, {}):
                out.append(Violation("paid_once", run_id, f"a paid model call for step {step} under epoch {epoch} "
                                                          "was never recorded, and no later claim explains its loss"))
    return out


def _cards_and_orders(conn: sa.Connection, ids: list[str]) -> list[Violation]:
    out = []
    per_card = Counter(card_id for (card_id,) in conn.execute(
        sa.select(orders.c.card_id).join(cart_cards, cart_cards.c.card_id == orders.c.card_id)
        .where(cart_cards.c.run_id.in_(ids))))
    for card_id, n in per_card.items():
        if n > 1:
            out.append(Violation("orders", card_id, f"{n} orders for one card"))
    renewals = Counter(run_id for (run_id,) in conn.execute(
        sa.select(run_ledger.c.run_id).where(run_ledger.c.run_id.in_(ids), run_ledger.c.kind == "effect_renewed")))
    per_decision: Counter[tuple[str, str]] = Counter()
    for run_id, key in conn.execute(sa.select(cart_cards.c.run_id, cart_cards.c.request_key)
                                    .where(cart_cards.c.run_id.in_(ids))):
        per_decision[(run_id, key.split("#", 1)[0])] += 1
    for (run_id, key), n in per_decision.items():
        if n > 1 + renewals[run_id]:
            out.append(Violation("cards", run_id, f"{n} cards for decision {key} ({renewals[run_id]} renewals)"))
    return out


def _accounts(conn: sa.Connection, ids: list[str], users: list[str], start_balance: int) -> list[Violation]:
    out = []
    for (run_id, reason) in conn.execute(sa.select(run_ledger.c.run_id, run_ledger.c.reason)
                                         .where(run_ledger.c.run_id.in_(ids),
                                                run_ledger.c.kind == "account_mismatch")):
        out.append(Violation("account", run_id, f"account_mismatch: {reason}"))
    for user in users:
        holds = conn.execute(sa.select(run_holds.c.state, run_holds.c.credits_held, run_holds.c.credits_charged,
                                       run_holds.c.credits_charged_before)
                             .where(run_holds.c.user_id == user)).all()
        charged = sum((h.credits_charged or 0) if h.state == "settled" else 0 for h in holds)
        charged += sum(h.credits_charged_before or 0 for h in holds)
        held = sum(h.credits_held for h in holds if h.state == "held")
        acc = conn.execute(sa.select(user_accounts.c.balance_credits, user_accounts.c.held_credits)
                           .where(user_accounts.c.user_id == user)).first()
        balance, on_account = (acc.balance_credits, acc.held_credits) if acc else (start_balance, 0)
        if balance != start_balance - charged or on_account != held:
            out.append(Violation("account", f"user {json.dumps(user)}",
                                 f"balance {balance} (expected {start_balance} - {charged} settled = "
                                 f"{start_balance - charged}), held {on_account} (open holds: {held})"))
    return out


def _stream(run_id: str) -> list[Violation]:
    out = []
    highest = -1
    seen: Counter[tuple[str, int]] = Counter()
    for ev in events.read(run_id):
        if ev.epoch < highest:
            out.append(Violation("stream_order", run_id, f"event {ev.eid} ({ev.type}) of epoch {ev.epoch} appended "
                                                         f"after an event of epoch {highest}"))
        highest = max(highest, ev.epoch)
        seen[(ev.eid, ev.epoch)] += 1
    for (eid, epoch), n in seen.items():
        if n > 1:
            out.append(Violation("stream_duplicate", run_id, f"event {eid} appended {n} times under epoch {epoch}"))
    return out


def _effects_recorded(ids: list[str]) -> list[Violation]:
    """A holder that got an effect's result (its stream says so) performed it through the effect helper,
    which records the creation, the reuse of a first result or its renewal in the same transaction."""
    with transaction(readonly=True) as conn:
        actions: dict[str, set[str]] = defaultdict(set)
        for run_id, action in conn.execute(sa.select(effects.c.run_id, effects.c.action)
                                           .where(effects.c.run_id.in_(ids))):
            actions[run_id].add(action)
        recorded = Counter((r, e) for r, e in conn.execute(
            sa.select(run_ledger.c.run_id, run_ledger.c.epoch)
            .where(run_ledger.c.run_id.in_([r for r in ids if r in actions]),
                   run_ledger.c.kind.in_(("effect_created", "effect_reused", "effect_renewed")))))
    out = []
    for run_id in sorted(actions):
        # A call whose arguments failed validation never reached the effect (fenced_agents.tools): not a result of it.
        results = {(ev.epoch, ev.eid) for ev in events.read(run_id)
                   if ev.type == "tool_result" and ev.data.get("name") in actions[run_id]
                   and not (isinstance(ev.data.get("result"), dict) and "invalid_arguments" in ev.data["result"])}
        shown = Counter(epoch for epoch, _eid in results)
        for epoch, n in sorted(shown.items()):
            if recorded[(run_id, epoch)] < n:
                out.append(Violation("effect_recorded", run_id,
                                     f"{n} effect results shown under epoch {epoch}, {recorded[(run_id, epoch)]} "
                                     f"effect ledger entries (created/reused/renewed) of that epoch"))
    return out
