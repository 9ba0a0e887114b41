"""`fenced explain RUN`: why a run was retried, dead-lettered, taken over, charged once, resumed, or waited."""

from __future__ import annotations

from fenced_cli.common import JsonOpt, RunArg, app, emit_json, out, resolve_run


@app.command()
def explain(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Answer from the run's ledger, in sentences with times, epochs and workers: why it was retried and how
    often, why it is in the dead letters, why two workers touched it, why it was not charged or carded
    twice, why it resumed and from which checkpoint, why it waited and for what."""
    from tasks.explain import explain as explain_run

    found = explain_run(resolve_run(run_id).run_id)
    if as_json:
        emit_json(found.to_dict())
        return
    # One line per sentence, never wrapped mid-word by us: a terminal folds it, a pipe or grep gets it whole.
    out.print(found.summary, soft_wrap=True)
    for answer in found.answers:
        out.print()
        out.print(answer.question, style="bold")
        for sentence in answer.sentences:
            out.print(f"  - {sentence}", soft_wrap=True)
