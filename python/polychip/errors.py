"""The exceptions polychip raises. The class follows the error code of the
polychip API (``polychip.errors.Error.code``); the message is the host's and
names what was wrong: the operator, the argument, the shape or dtype, the
file or the rank.

Each class also derives from the built-in exception Python code expects for
its kind (``ValueError``, ``MemoryError``, ...). An invalid argument and an
out-of-memory error are ``RuntimeError`` too, as PyTorch's own are (its
shape errors, and ``torch.OutOfMemoryError``), so code written for
PyTorch that catches ``RuntimeError`` (a batch-size finder, a retry) catches
them on ``polychip:N`` as well."""


class Error(Exception):
    """Any polychip error; ``code`` is the API's error code."""

    code = 4


class InvalidArgument(Error, ValueError, RuntimeError):
    """An argument is wrong: out of range, a freed tensor, a bad layout."""

    code = 1


class OutOfMemory(Error, MemoryError, RuntimeError):
    """A device ran out of memory."""

    code = 2


class Unimplemented(Error, NotImplementedError):
    """The device's plugin does not implement the operator."""

    code = 3


class Internal(Error, RuntimeError):
    """A fault inside polychip or a plugin that broke its contract."""

    code = 4


class VersionMismatch(Error, RuntimeError):
    """An API, ABI or DLPack version is not supported."""

    code = 5


class ShapeMismatch(InvalidArgument):
    """Tensor shapes do not fit the operation."""

    code = 6


class DTypeMismatch(InvalidArgument, TypeError):
    """Tensor dtypes do not fit the operation."""

    code = 7


class DeviceLost(Error, RuntimeError):
    """A device stopped working."""

    code = 8


class Panic(Internal):
    """A panic inside polychip or a Rust plugin was caught."""

    code = 9


class Timeout(Error, TimeoutError):
    """A collective or a rendezvous did not complete in time."""

    code = 10


class PeerLost(Error, ConnectionError):
    """A peer rank died or left the job."""

    code = 11


class Unavailable(Error, RuntimeError):
    """The environment does not allow the request (launcher, transport)."""

    code = 12


class IOError(Error, OSError):  # noqa: A001 - the API's name for the code
    """Reading or writing a file or a socket failed."""

    code = 13
