"""`from fenced.openai_agents import FencedOpenAIAgent`: an OpenAI Agents SDK agent behind fenced (the
openai-agents extra, `pip install 'fenced[openai-agents]'`).

`FencedOpenAIAgent(agent, effects={...})` runs an unchanged `agents.Agent` one model turn (the model's
response and the tool calls it asks for) per fenced step; the checkpoint is the SDK's own input list.

What holds under a crash (kill -9 of the holder mid-step): a step whose model response reached checkpoint
A is replayed from the recorded response: the model is not asked (nor paid) again, read-only tools run
again, and a tool named in `effects` returns the result its first run recorded without running again
(once per run, tool and arguments, through `tasks.context.once`). A step killed before checkpoint A asks
the model again; that lost call is the platform's cost, not billed to the user.

What holds under a takeover (the holder frozen past its lease, another worker finishes the run): the new
holder resumes from the last checkpoint as above; when the old holder wakes, its checkpoint, effect and
terminal writes are refused by the epoch fence and its events by the Redis mirror, so the run is done
once, settled once, and each effect has run once.

Not supported, failing the run with a terminal error that says so: the SDK's human-in-the-loop
approvals (`needs_approval`; use `fenced.ask_user` inside the tool, which parks the run), streaming
(`Runner.run_streamed`); handoffs are refused when the wrapper is built.
"""

from fenced_agents.openai_agents import FencedOpenAIAgent

__all__ = ["FencedOpenAIAgent"]
