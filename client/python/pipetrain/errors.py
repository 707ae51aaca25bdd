"""Exceptions of the pipetrain client.

Every error is a PipetrainError. A reply whose Response.code is not OK raises
the ServerError subclass named after the code (schema/api.fbs: BadRequest,
Unauthorized, InvalidJob, NotFound, Conflict, Unavailable, Internal), with
the server's code (int), its name and message. A server that cannot be
reached raises ConnectError; one that does not answer in time, Timeout.
"""


class PipetrainError(Exception):
    """Base of every error this package raises."""


class ConnectError(PipetrainError):
    """The server could not be reached (nothing listens at the URL, or the
    connection dropped)."""


class Timeout(PipetrainError):
    """No reply within the client's timeout."""


class ProtocolError(PipetrainError):
    """A reply that does not answer the request (wrong id or body type, a
    buffer that is no Response), or a download that does not add up."""


class ChecksumError(PipetrainError):
    """A downloaded checkpoint's SHA-256 differs from the server's."""


class ServerError(PipetrainError):
    """The server answered with an error code: .code (int), .name, .message."""

    code = None
    name = "ServerError"

    def __init__(self, message, code=None, name=None):
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name
        self.message = message
        super().__init__(f"{self.name}: {message}" if message else self.name)


def _server_error(name, code):
    return type(name, (ServerError,), {"code": code, "name": name,
                                       "__doc__": f"Response.code {name} ({code})."})


BadRequest = _server_error("BadRequest", 1)
Unauthorized = _server_error("Unauthorized", 2)
InvalidJob = _server_error("InvalidJob", 3)
NotFound = _server_error("NotFound", 4)
Conflict = _server_error("Conflict", 5)
Unavailable = _server_error("Unavailable", 6)
Internal = _server_error("Internal", 7)

BY_CODE = {c.code: c for c in (BadRequest, Unauthorized, InvalidJob, NotFound, Conflict,
                               Unavailable, Internal)}


def from_reply(code, name, message):
    """The exception for a Response with this code (a code newer than this
    package is a plain ServerError that still carries it)."""
    cls = BY_CODE.get(code)
    if cls is None:
        return ServerError(message, code=code, name=name)
    return cls(message)
