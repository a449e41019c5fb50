"""The contract's requests as methods of both clients, each declared once, by its builder.

A builder in :mod:`backplane_client.calls` holds a request's signature and docstring.
:class:`Request` makes it a method of whichever client it is read from: on
:class:`~backplane_client.AgentClient` the method sends the call and returns the answer, on
:class:`~backplane_client.AsyncAgentClient` it is a coroutine function doing the same. Which one
is decided by the client's ``send``, the only thing the two clients do differently: blocking or
awaiting. :class:`Requests` lists the requests; a new call of the contract is a builder and one
line there.

:class:`Sender` is also what a :class:`~backplane_client.TaskSession` needs from its client, so
the session depends on this module and not on the client that makes sessions.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from backplane_client import calls
from backplane_client.calls import Call
from backplane_client.retry import RetryPolicy

__all__ = ["AsyncSender", "Request", "Requests", "Sender", "http_settings"]

P = ParamSpec("P")
T = TypeVar("T")


class Sender(Protocol):
    """Sends one call, retrying as its policy allows, and returns the answer it reads."""

    def send(self, call: Call[T], *, retry: RetryPolicy | None = None) -> T: ...


class AsyncSender(Protocol):
    """:class:`Sender`, awaited."""

    def send(self, call: Call[T], *, retry: RetryPolicy | None = None) -> Awaitable[T]: ...


def http_settings(base_url: str, token: str, timeout: float) -> dict[str, Any]:
    """What either client's own httpx client is made with: the server's root, the agent's token."""
    return {
        "base_url": base_url.rstrip("/"),
        "headers": {"Authorization": f"Bearer {token}", "Accept": "application/json"},
        "timeout": timeout,
    }


def _blocking(build: Callable[P, Call[T]]) -> Callable[Concatenate[Sender, P], T]:
    def method(client: Sender, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return client.send(build(*args, **kwargs))

    return method


def _awaiting(build: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncSender, P], Coroutine[Any, Any, T]]:
    async def method(client: AsyncSender, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await client.send(build(*args, **kwargs))

    return method


def _present(method: Any, build: Callable[..., Any], signature: inspect.Signature) -> None:
    """Name and document ``method`` as its builder; ``Any``, as mypy knows no ``__signature__``
    on a function, and that is what :func:`inspect.signature` and ``help()`` read."""
    method.__name__ = method.__qualname__ = build.__name__
    method.__doc__ = build.__doc__
    method.__signature__ = signature


class Request(Generic[P, T]):
    """A builder of :mod:`~backplane_client.calls` as a client method with its parameters.

    The method carries the builder's name, docstring and signature (``self`` first, the answer
    as the return type), so ``help()`` and :func:`inspect.signature` show what the builder says.
    """

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        signature = inspect.signature(build, eval_str=True)
        # The builder returns Call[answer]; the method returns what that call's answer reads as.
        (answer,) = typing.get_args(signature.return_annotation)
        shown = signature.replace(
            parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *signature.parameters.values()],
            return_annotation=answer,
        )
        self._blocking = _blocking(build)
        self._awaiting = _awaiting(build)
        for method in (self._blocking, self._awaiting):
            _present(method, build, shown)

    @overload
    def __get__(
        self, client: None, owner: type[AsyncSender]
    ) -> Callable[Concatenate[AsyncSender, P], Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: None, owner: type[Sender]) -> Callable[Concatenate[Sender, P], T]: ...
    @overload
    def __get__(self, client: AsyncSender, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, client: Sender, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, client: object, owner: type[Any]) -> Callable[..., Any]:
        method: Callable[..., Any] = self._awaiting if inspect.iscoroutinefunction(owner.send) else self._blocking
        return method if client is None else MethodType(method, client)


class Requests:
    """Every request of the contract, as methods of the client that inherits them."""

    create_task = Request(calls.create_task)
    get_task = Request(calls.get_task)
    list_tasks = Request(calls.list_tasks)
    verify = Request(calls.verify)
    events = Request(calls.events)
    append = Request(calls.append)
    append_batch = Request(calls.append_batch)
    claim = Request(calls.claim)
    heartbeat = Request(calls.heartbeat)
    release = Request(calls.release)
    recovery_context = Request(calls.recovery_context)
    fork = Request(calls.fork)
    diff = Request(calls.diff)
    dispatch_tool_call = Request(calls.dispatch_tool_call)
    record_tool_result = Request(calls.record_tool_result)
    get_tool_call = Request(calls.get_tool_call)
    get_approval = Request(calls.get_approval)
    await_signal = Request(calls.await_signal)
    get_signal = Request(calls.get_signal)
    send_signal = Request(calls.send_signal)
    personal_open = Request(calls.personal_open)
    personal_lookup = Request(calls.personal_lookup)
    invoke = Request(calls.invoke)
    dispatch_subtask = Request(calls.dispatch_subtask)
