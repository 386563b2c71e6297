"""Errors a user can cause by pointing Strata at the wrong file. Each carries a one-line reason."""


class ModelError(ValueError):
    """A model file Strata cannot use; `str(err)` is the one-line reason shown to the user."""


class NotGGUF(ModelError):
    pass


class TruncatedFile(ModelError):
    pass


class CorruptFile(ModelError):
    """A header value no valid file holds: a count, type, alignment or offset out of range."""


class BadMetadata(ModelError):
    """Metadata a model cannot have: a zero head count, a NaN norm epsilon, a wrong value type."""


class UnsupportedArchitecture(ModelError):
    pass


class MissingTensor(ModelError):
    pass


class ShapeMismatch(ModelError):
    pass


class TensorTypeError(ModelError):
    """A tensor stored in a type its role never has (an F32 norm is fine, a Q4_K one is not)."""


class ShardError(ModelError):
    pass
