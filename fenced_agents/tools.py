"""Tools and effects from plain typed functions: the schema the model sees and the check of its arguments.

A function's type hints and docstring become a pydantic model of its arguments (unknown arguments are
refused); its JSON schema is what the model is shown, and the model's arguments are validated against
it before the function runs. Arguments that do not validate never reach the function: the tool's
result is `{"error": ..., "invalid_arguments": [{"field", "problem"}, ...]}`, naming each field, so the
model can fix its own call in the next step (nothing is performed, nothing is raised).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, get_type_hints

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from tasks import context

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class ToolContext:
    """The run a tool or effect is called in: a function whose first parameter is named `ctx` (or is
    annotated ToolContext) gets one. `idempotency_key` is set in an effect only: pass it to an outside
    API, because a crash after that API answered and before the effect's record committed runs the
    effect again (on the next holder) with the same key. After a takeover the new holder's context has a
    higher `epoch`; an effect still attempted through the old one is refused, recording nothing."""

    run_id: str
    epoch: int  # the holder's fencing token: a takeover raises it
    user_id: str
    step: int
    call_id: str | None
    idempotency_key: str | None = None


class FunctionTool:
    """A plain function the model can call. `kind` is "tool" (read-only: it runs again whenever its step
    is replayed after a crash or a takeover, so it must be safe to repeat), "effect" (runs once per
    run, action and validated arguments, fenced by the epoch: a replay or a fenced-out zombie gets the
    first result, never a second execution) or "ask_user" (parks the run until a person replies).

    Calling the object calls the function itself, outside any run (for tests)."""

    def __init__(self, fn: Callable[..., Any], kind: str = "tool", action: str | None = None,
                 name: str | None = None) -> None:
        if kind not in ("tool", "effect", "ask_user"):
            raise ValueError(f"kind must be tool, effect or ask_user, not {kind!r}")
        self.fn = fn
        self.kind = kind
        self.name = name or fn.__name__
        if not _NAME.match(self.name):
            raise ValueError(f"a tool name must match {_NAME.pattern}, not {self.name!r}")
        self.action = (action or self.name) if kind == "effect" else None
        if self.action is not None and not 0 < len(self.action) <= 64:
            raise ValueError(f"an effect's action must be 1 to 64 characters, not {self.action!r}")
        self.description, self.args_model, self.takes_ctx = _describe(fn, self.name)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._parameters: bytes | None = None  # the schema as JSON, built once (spec)

    @property
    def read_only(self) -> bool:
        """True for a plain tool: it may run again on any replay of its step."""
        return self.kind == "tool"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name}>"

    def spec(self) -> dict[str, Any]:
        """What the model is shown: name, description and the JSON schema of the arguments (a fresh copy
        each call; the schema is built once per tool, since pydantic takes about 0.2 ms to build it and
        the agent loop asks for every tool's spec at every step)."""
        if self._parameters is None:
            self._parameters = orjson.dumps(_untitled(self.args_model.model_json_schema()))
        return {"name": self.name, "description": self.description, "parameters": orjson.loads(self._parameters)}

    def validate(self, args: dict[str, Any]) -> BaseModel:
        """The model's arguments as the function's types; InvalidArguments names every bad field."""
        if set(args) == {"__invalid_json__"}:
            raise InvalidArguments(self.name, None, [{"field": "(arguments)", "problem": "not a JSON object: "
                                                      f"{args['__invalid_json__']!r}"}])
        try:
            return self.args_model.model_validate(args)
        except ValidationError as exc:
            raise InvalidArguments(self.name, exc) from None

    def call(self, args: dict[str, Any]) -> Any:
        """Run the tool for one model call inside a fenced step; returns a JSON-able result."""
        try:
            valid = self.validate(args)
        except InvalidArguments as exc:
            return exc.as_result()
        kwargs = {field: getattr(valid, field) for field in type(valid).model_fields}
        run = context.current()
        info = ToolContext(run.run_id, run.epoch, run.user_id, run.step, run.call_id)
        if self.kind != "effect":
            return to_jsonable_python(self._invoke(info, kwargs))
        action = self.action or self.name

        def perform(key: str) -> Any:
            return to_jsonable_python(self._invoke(ToolContext(**{**info.__dict__, "idempotency_key": key}), kwargs))

        return context.once(action, valid.model_dump(mode="json"), perform)

    def _invoke(self, info: ToolContext, kwargs: dict[str, Any]) -> Any:
        return self.fn(info, **kwargs) if self.takes_ctx else self.fn(**kwargs)


class InvalidArguments(ValueError):
    """A model's arguments that do not fit the tool's signature; `problems` names each field. The tool is
    not called: the problems go back to the model as the call's result, recorded at checkpoint B, so a
    crash or a takeover replays the same refusal instead of calling the tool."""

    def __init__(self, tool: str, exc: ValidationError | None, problems: list[dict[str, str]] | None = None) -> None:
        self.tool = tool
        self.problems = problems or [
            {"field": ".".join(str(p) for p in e["loc"]) or "(arguments)", "problem": _problem(e)}
            for e in (exc.errors() if exc else [])]
        super().__init__(f"{tool}: " + "; ".join(f"{p['field']}: {p['problem']}" for p in self.problems))

    def as_result(self) -> dict[str, Any]:
        return {"error": f"invalid arguments, the tool did not run: {self}", "invalid_arguments": self.problems}


def _problem(error: Any) -> str:
    if error["type"] in ("missing", "extra_forbidden"):
        return str(error["msg"])
    return f"{error['msg']} (got {error.get('input')!r})"


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Mark a plain typed function as a read-only tool (`@tool` or `@tool(name=...)`), to pass in
    `Agent(tools=[...])`. It reruns whenever its step is replayed after a crash or takeover."""
    if fn is None:
        return lambda f: FunctionTool(f, "tool", name=name)
    return FunctionTool(fn, "tool", name=name)


def effect(action: str, *, name: str | None = None) -> Callable[[Callable[..., Any]], FunctionTool]:
    """Mark a function as an effect named `action`: it runs once per (run, action, validated arguments),
    fenced by the holder's epoch (tasks.context.once); a replay after a crash or takeover gets its first
    result back. Its first parameter is the ToolContext (with `idempotency_key`)."""
    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(fn, "effect", action=action, name=name)

    return wrap


def as_tool(obj: Any) -> FunctionTool:
    """A FunctionTool as is; a plain function as a read-only tool."""
    if isinstance(obj, FunctionTool):
        return obj
    if callable(obj):
        return FunctionTool(obj, "tool")
    raise TypeError(f"a tool is a function or a @tool/@effect, not {obj!r}")


def _ask_user(question: str) -> dict[str, str]:
    """Ask the person who made the request a question and wait for their reply.

    Args:
        question: the question, as the person will read it.
    """
    return {"reply": context.ask_user(question)}


def ask_user_tool() -> FunctionTool:
    """The `ask_user` tool every agent has: the run parks (waiting) until the person replies, and the
    replay after the reply returns `{"reply": ...}` (the question is keyed by its tool call id)."""
    return FunctionTool(_ask_user, "ask_user", name="ask_user")


def _describe(fn: Callable[..., Any], name: str) -> tuple[str, type[BaseModel], bool]:
    """(description, the arguments' pydantic model, whether the first parameter is the ToolContext)."""
    sig = inspect.signature(fn)
    hints = get_type_hints(fn, include_extras=True)
    summary, arg_docs = _parse_doc(inspect.getdoc(fn) or "")
    params = list(sig.parameters.values())
    takes_ctx = bool(params) and (params[0].name == "ctx" or hints.get(params[0].name) is ToolContext)
    fields: dict[str, Any] = {}
    for p in params[1:] if takes_ctx else params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {name}: parameter {p.name!r} must be a named parameter (no *args, **kwargs, /)")
        annotation = hints.get(p.name, Any)
        if p.name in arg_docs:
            annotation = Annotated[annotation, Field(description=arg_docs[p.name])]
        fields[p.name] = (annotation, ... if p.default is p.empty else p.default)
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return summary, model, takes_ctx


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    """The docstring's text before its Args: section, and each argument's line in it (Google style)."""
    lines = doc.splitlines()
    args: dict[str, str] = {}
    summary: list[str] = []
    in_args = False
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            m = re.match(r"^\s+(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$", line)
            if m:
                args[m.group(1)] = m.group(2).strip()
            elif stripped and not line.startswith((" ", "\t")):
                in_args = False  # another section starts
            elif stripped and args:
                last = list(args)[-1]
                args[last] += " " + stripped
            if in_args:
                continue
        if not in_args and re.match(r"^(Returns|Raises|Yields|Examples?):$", stripped):
            break
        summary.append(line)
    return "\n".join(summary).strip(), args


def _untitled(schema: Any) -> Any:
    """The schema without pydantic's generated `title` strings (noise in every prompt)."""
    if isinstance(schema, dict):
        return {k: _untitled(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_untitled(v) for v in schema]
    return schema
