"""graphdecode.Error: every refusal of the engine, with the field and the value it names."""

from __future__ import annotations


class Error(ValueError):
    """A request, option, config or checkpoint graphdecode refused, or a CUDA failure.

    Raised for the C++ library's ``graphdecode::Error`` and for arguments the Python layer cannot
    convert. ``field`` names what was refused (``"prompt[3]"``, ``"sampling.top_p"``,
    ``"max_batch"``; empty when no single field is at fault), ``value`` is its value as text,
    ``where`` the place that refused it (``file:line`` in the library), ``message`` the reason.
    ``str(error)`` is the library's full text: ``graphdecode: MESSAGE [FIELD = VALUE] (at WHERE)``.
    """

    def __init__(self, message: str, field: str = "", value: str = "", where: str = "") -> None:
        text = "graphdecode: " + message
        if field:
            text += f" [{field} = {value}]"
        if where:
            text += f" (at {where})"
        super().__init__(text)
        self.message = message
        self.field = field
        self.value = value
        self.where = where

    def __reduce__(self):  # picklable: multiprocessing workers can raise it back to a parent
        return (type(self), (self.message, self.field, self.value, self.where))
