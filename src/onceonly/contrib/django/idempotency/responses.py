"""Django responses for the policy's answers, and what of a view's response it keeps."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import TypeGuard

from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.template.response import SimpleTemplateResponse

from ....asgi import problem_body
from ....idempotency.policy import Problem, Recorder, Replay

__all__ = [
    "django_answer",
    "keep_problem",
    "problem_response",
    "replay_response",
    "response_headers",
    "unrendered",
]


# Responses.


def problem_response(problem: Problem) -> HttpResponse:
    """A problem the policy answers, as an ``application/problem+json`` response."""
    body = problem_body(problem.status, problem.reason, problem.title, problem.detail)
    response = HttpResponse(body, status=problem.status, content_type="application/problem+json")
    for name, value in problem.headers:
        response.headers[name.decode("latin-1")] = value.decode("latin-1")
    return response


def replay_response(
    replay: Replay, chunks: Iterable[bytes] | AsyncIterator[bytes] | None
) -> HttpResponseBase:
    """A stored answer as Django sends it; `chunks` are its body when it was stored in chunks."""
    response: HttpResponseBase
    if replay.body is not None:
        response = HttpResponse(replay.body, status=replay.status)
    else:
        assert chunks is not None
        response = StreamingHttpResponse(chunks, status=replay.status)
    # Django adds a text/html Content-Type of its own: only the stored ones count.
    del response.headers["Content-Type"]
    for raw_name, raw_value in replay.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name == "set-cookie":  # only with replay_set_cookie=True
            response.cookies.load(value)
        elif name in response.headers:
            # Django keeps one value a name: repeats are joined, as RFC 9110 allows.
            response.headers[name] = f"{response.headers[name]}, {value}"
        else:
            response.headers[name] = value
    return response


def response_headers(response: HttpResponseBase, cookies: bool) -> list[tuple[bytes, bytes]]:
    """A response's headers as the recorder takes them (its cookies with `cookies`)."""
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers.items()]
    if cookies:
        for morsel in response.cookies.values():
            raw.append((b"set-cookie", morsel.output(header="").strip().encode("latin-1")))
    return raw


def unrendered(response: HttpResponseBase) -> TypeGuard[SimpleTemplateResponse]:
    """A TemplateResponse from a decorated view, which Django renders only
    after the view returns: its content is what is stored."""
    return isinstance(response, SimpleTemplateResponse) and not response.is_rendered


def keep_problem(recorder: Recorder, problem: Problem | None) -> None:
    """Hand the recorder the problem answered instead of the view's response."""
    if problem is not None:
        recorder.start(problem.status, [(b"content-type", b"application/problem+json")])
        body = problem_body(problem.status, problem.reason, problem.title, problem.detail)
        recorder.take(body, more=False)


def django_answer(request: HttpRequest, exc: Exception) -> HttpResponseBase:
    """The response Django gives for `exc` (handler500, logged, signalled)."""
    from django.core.handlers.exception import response_for_exception

    return response_for_exception(request, exc)
